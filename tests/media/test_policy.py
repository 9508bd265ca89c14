"""The media policy: every path rule and cap with JevAny's message, on files made in the test."""
import os
import random
import sys

import pytest

from jevany_client.errors import InvalidRequestError
from jevany_daemon.media.policy import MediaPolicy

from .clips import steps, write_clip

av = pytest.importorskip("av")
Image = pytest.importorskip("PIL.Image")


def image(path, size=(32, 24), fmt="PNG", mode="RGB"):
    Image.new(mode, size, color=0).save(path, fmt)
    return path


def video(path, frames=6, size=(32, 32), container="mp4", codec="mpeg4"):
    return write_clip(path, steps(frames, size, colour=(1, 0, 0)), fps=6, container=container, codec=codec)


def audio_only(path):
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=8000)
        frame = av.AudioFrame(format="fltp", layout="mono", samples=1024)
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


@pytest.fixture
def root(tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    return media


def refusal(policy, items) -> str:
    with pytest.raises(InvalidRequestError) as info:
        policy.resolve(items)
    return info.value.message


def test_good_files_resolve_inside_the_root(root):
    image(root / "a.png")
    image(root / "b.jpg", fmt="JPEG")
    video(root / "v.mp4")
    (root / "sub").mkdir()
    os.symlink(root / "a.png", root / "sub" / "link.png")      # a symlink inside the root is followed
    policy = MediaPolicy(str(root))
    got = policy.resolve([("image", "a.png"), ("image", str(root / "b.jpg")), ("video", "v.mp4"),
                          ("image", "sub/link.png")])
    assert got == [("image", root / "a.png"), ("image", root / "b.jpg"), ("video", root / "v.mp4"),
                   ("image", root / "a.png")]


def test_every_path_rule_has_its_message(root, tmp_path):
    image(tmp_path / "outside.png")
    os.symlink(tmp_path / "outside.png", root / "escape.png")
    (root / "dir").mkdir()
    image(root / "a.png")
    policy = MediaPolicy(str(root))
    assert refusal(MediaPolicy(None), [("image", "a.png")]) == \
        "media is disabled; the server operator must set JEVANY_MEDIA_ROOT"
    assert refusal(MediaPolicy(str(tmp_path / "gone")), [("image", "a.png")]) == "configured media root is unavailable"
    assert refusal(MediaPolicy(str(root / "a.png")), [("image", "a.png")]) == "configured media root is not a directory"
    assert refusal(policy, [("image", "https://example.com/a.png")]) == "network media URIs are not allowed"
    assert refusal(policy, [("image", "nope.png")]) == "media file does not exist"
    assert refusal(policy, [("image", "../outside.png")]) == "media path is outside JEVANY_MEDIA_ROOT"
    assert refusal(policy, [("image", str(tmp_path / "outside.png"))]) == "media path is outside JEVANY_MEDIA_ROOT"
    assert refusal(policy, [("image", "escape.png")]) == "media path is outside JEVANY_MEDIA_ROOT"
    assert refusal(policy, [("image", "dir")]) == "media path is not a regular file"


def test_a_file_the_server_may_not_read(root, monkeypatch):
    # Tests run as root here, where permissions never refuse; what the OS raises is what matters.
    from pathlib import Path

    real = Path.resolve

    def resolve(self, strict=False):
        if self.name == "secret.png":
            raise PermissionError(13, "Permission denied")
        return real(self, strict=strict)

    monkeypatch.setattr(Path, "resolve", resolve)
    assert refusal(MediaPolicy(str(root)), [("image", "secret.png")]) == \
        "server cannot access media file; check shared directory and file permissions"


def test_every_cap_has_its_message(root):
    image(root / "a.png", size=(64, 64))
    image(root / "b.png", size=(64, 64))
    video(root / "v.mp4", frames=8, size=(32, 32))
    size = (root / "a.png").stat().st_size
    assert refusal(MediaPolicy(str(root), max_bytes=size - 1, total_bytes=size * 10), [("image", "a.png")]) == \
        f"media file exceeds {size - 1} bytes"
    both = size + (root / "b.png").stat().st_size
    assert refusal(MediaPolicy(str(root), max_bytes=size * 2, total_bytes=both - 1),
                   [("image", "a.png"), ("image", "b.png")]) == f"media files exceed {both - 1} bytes in total"
    assert refusal(MediaPolicy(str(root), max_pixels=64 * 64 - 1), [("image", "a.png")]) == \
        f"image exceeds {64 * 64 - 1} pixels"
    assert refusal(MediaPolicy(str(root), max_pixels=32 * 32 - 1), [("video", "v.mp4")]) == \
        f"video frame exceeds {32 * 32 - 1} pixels"
    assert refusal(MediaPolicy(str(root), max_video_frames=7), [("video", "v.mp4")]) == "video exceeds 7 frames"
    assert MediaPolicy(str(root), max_video_frames=8).resolve([("video", "v.mp4")])
    # Each cap is a size a request may reach: files of exactly max_bytes, totalling exactly total_bytes.
    exactly = MediaPolicy(str(root), max_bytes=max(size, both - size), total_bytes=both)
    assert len(exactly.resolve([("image", "a.png"), ("image", "b.png")])) == 2


def test_a_decompression_bomb_is_refused_before_decoding(root, monkeypatch):
    # 25 million pixels in a few kilobytes: the header alone says too much.
    Image.new("1", (5000, 5000)).save(root / "bomb.png", "PNG")
    assert (root / "bomb.png").stat().st_size < 50_000
    assert refusal(MediaPolicy(str(root)), [("image", "bomb.png")]) == f"image exceeds {4096 * 4096} pixels"
    # and where Pillow's own guard fires first, the message is still ours
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    image(root / "small.png", size=(64, 64))
    assert refusal(MediaPolicy(str(root)), [("image", "small.png")]) == f"image exceeds {4096 * 4096} pixels"


def test_broken_files_get_a_typed_error(root):
    image(root / "whole.jpg", size=(256, 256), fmt="JPEG")
    data = (root / "whole.jpg").read_bytes()
    (root / "truncated.jpg").write_bytes(data[: len(data) // 2])
    image(root / "whole.png", size=(64, 64))
    png = (root / "whole.png").read_bytes()
    (root / "truncated.png").write_bytes(png[: len(png) - 20])
    # Fixed noise: a random draw is now and then read by PyAV as a container with no video stream,
    # a refusal of its own ("video file has no video stream"), which made this test flaky.
    noise = random.Random(7).randbytes(2000)
    (root / "noise.png").write_bytes(noise)
    (root / "noise.mp4").write_bytes(noise)
    video(root / "whole.mp4")
    (root / "truncated.mp4").write_bytes((root / "whole.mp4").read_bytes()[:200])
    policy = MediaPolicy(str(root))
    for name, kind in (("truncated.jpg", "image"), ("truncated.png", "image"), ("noise.png", "image"),
                       ("truncated.mp4", "video"), ("noise.mp4", "video")):
        assert refusal(policy, [(kind, name)]) == "media file could not be validated", name


def test_videos_without_a_video_stream_or_a_frame_count(root):
    audio_only(root / "sound.mp4")
    video(root / "stream.mkv", container="matroska")       # Matroska does not declare a frame count
    policy = MediaPolicy(str(root))
    assert refusal(policy, [("video", "sound.mp4")]) == "video file has no video stream"
    assert refusal(policy, [("video", "stream.mkv")]) == "video frame count is unavailable"


def test_a_missing_decoder_says_to_install_the_multimodal_extra(root, monkeypatch):
    video(root / "v.mp4")
    monkeypatch.setitem(sys.modules, "av", None)      # import av now raises ImportError
    assert refusal(MediaPolicy(str(root)), [("video", "v.mp4")]) == "install the multimodal extra to serve media"
    image(root / "a.png")
    monkeypatch.setitem(sys.modules, "PIL", None)
    assert refusal(MediaPolicy(str(root)), [("image", "a.png")]) == "install the multimodal extra to serve media"


def test_limits_are_reported_under_jevanys_names(root):
    policy = MediaPolicy(str(root))
    assert policy.limits(("image",)) == {"media_enabled": True, "media_max_file_bytes": 50 << 20,
                                         "media_max_total_bytes": 100 << 20, "media_max_pixels": 4096 * 4096,
                                         "media_max_video_frames": 3600}
    assert policy.limits(()) ["media_enabled"] is False
    assert MediaPolicy(None).limits(("image",))["media_enabled"] is False
