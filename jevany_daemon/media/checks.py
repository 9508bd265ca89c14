"""Checking a media file's bytes for what they declare, before anything decodes them in full.

The bytes are the ones files.read_regular read, never the path opened again.

Images: Pillow reads the header (width × height against the pixel cap, so a
decompression bomb is refused before a pixel is decoded), then verify()
walks the file's structure and a full decode, bounded by the cap, finds
truncated data. Videos: PyAV opens the container; it must have a
video stream whose frame size is under the pixel cap and which declares its
frame count, under the frame cap. Pillow and PyAV are the multimodal extra:
without them, "install the multimodal extra to serve media". Anything else
that goes wrong in a decoder is "media file could not be validated": a
hostile file gets a typed error, never a traceback.
"""
import io

from jevany_client.errors import InvalidRequestError


def check(kind: str, data: bytes, max_pixels: int, max_frames: int) -> None:
    try:
        if kind == "image":
            _image(data, max_pixels)
        else:
            _video(data, max_pixels, max_frames)
    except InvalidRequestError:
        raise
    except ImportError:
        raise InvalidRequestError("install the multimodal extra to serve media") from None
    except Exception:   # noqa: BLE001 - a decoder's failure on a bad file is the caller's error
        raise InvalidRequestError("media file could not be validated") from None


def _image(data: bytes, max_pixels: int) -> None:
    from PIL import Image

    try:
        opened = Image.open(io.BytesIO(data))        # reads the header only
    except Image.DecompressionBombError:
        # Pillow's own guard, far above any sane cap, refuses before ours is asked.
        raise InvalidRequestError(f"image exceeds {max_pixels} pixels") from None
    with opened as image:
        if image.width * image.height > max_pixels:
            raise InvalidRequestError(f"image exceeds {max_pixels} pixels")
        image.verify()
    # verify() checks a PNG's chunks but not a JPEG's data: decode it too, now that the
    # pixel cap bounds what decoding costs, so a truncated file is refused here.
    with Image.open(io.BytesIO(data)) as image:
        image.load()


def _video(data: bytes, max_pixels: int, max_frames: int) -> None:
    import av

    with av.open(io.BytesIO(data)) as container:
        streams = container.streams.video
        if not streams:
            raise InvalidRequestError("video file has no video stream")
        stream = streams[0]
        if stream.width * stream.height > max_pixels:
            raise InvalidRequestError(f"video frame exceeds {max_pixels} pixels")
        if not stream.frames:
            raise InvalidRequestError("video frame count is unavailable")
        if stream.frames > max_frames:
            raise InvalidRequestError(f"video exceeds {max_frames} frames")
