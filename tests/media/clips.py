"""Video clips made in the test: frames as arrays, and files encoded from them with PyAV (never committed)."""
from fractions import Fraction

import numpy as np
import pytest


def steps(frames: int, size=(32, 32), colour=(1, 1, 1)) -> np.ndarray:
    """[frames, height, width, 3] uint8 flat frames, frame i of brightness 30 i in COLOUR's channels."""
    width, height = size
    levels = (np.arange(frames) * 30).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None] * np.array(colour, np.uint8), (frames, height, width, 3)).copy()


def gradients(frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """[frames, height, width, 3] uint8 frames with detail at every scale: ramps that move, plus noise."""
    y, x = np.mgrid[0:height, 0:width]
    t = np.arange(frames)[:, None, None]
    channels = [x * 255 // max(width - 1, 1) + 17 * t, y * 255 // max(height - 1, 1) + 29 * t, (x * y + 40 * t) % 97]
    noise = np.random.default_rng(seed).integers(0, 40, (frames, height, width, 3))
    return ((np.stack(channels, axis=-1) + noise) % 256).astype(np.uint8)


def write_clip(path, pixels: np.ndarray, fps: int = 4, container: str | None = None, codec: str = "mpeg4"):
    """PATH: PIXELS ([frames, height, width, 3] uint8, even sizes) encoded at FPS frames a second."""
    av = pytest.importorskip("av")

    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=Fraction(fps, 1))
        stream.height, stream.width = pixels.shape[1:3]
        stream.pix_fmt = "yuv420p"
        for frame in pixels:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path
