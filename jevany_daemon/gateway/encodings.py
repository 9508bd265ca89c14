"""Request bodies sent compressed (Content-Encoding), decoded with a bound on the decoded bytes.

typesafe-sdk sends every body of 1 KiB or more as `Content-Encoding: zstd`
wherever zstd is available (Python 3.14, or its `[zstd]` extra); gzip is the
encoding every other HTTP client can send. A body is decoded whole, at most
--max-message-bytes of output and one byte more to tell that it went past:
a zstd bomb (a few kilobytes that would decode to gigabytes) costs no more
than a plain body of the cap, a frame whose header declares a larger size is
refused unread, and one asking for a window larger than the cap (or 8 MiB)
is refused before anything is allocated for it.
"""
import math
import zlib

ENCODINGS = ("zstd", "gzip")
MAX_WINDOW_LOG = 27               # zstd's own default bound on a decoder's window (128 MiB)
MIN_WINDOW_LOG = 23
# Frames (zstd) or members (gzip) in one body: clients write one; each further one costs a copy of the rest.
MAX_FRAMES = 16


class BodyEncodingError(ValueError):
    """A body that cannot be decoded: status is the HTTP answer (413 past the cap, 415, 400)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def decode(body: bytes, encoding: str, limit: int) -> bytes:
    """body decoded from encoding (a Content-Encoding value); at most limit bytes, else 413."""
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return body
    if name == "zstd":
        return _zstd(body, limit)
    if name in ("gzip", "x-gzip"):
        return _gzip(body, limit)
    raise BodyEncodingError(415, f"Content-Encoding {encoding!r} is not accepted; send the body as it is, "
                                 f"or encoded with one of: {', '.join(ENCODINGS)}")


def _zstd(body: bytes, limit: int) -> bytes:
    try:
        from compression.zstd import (DecompressionParameter, ZstdDecompressor, ZstdError,  # Python 3.14
                                      get_frame_info)
    except ImportError:
        try:
            from backports.zstd import DecompressionParameter, ZstdDecompressor, ZstdError, get_frame_info
        except ImportError:
            raise BodyEncodingError(415, "zstd bodies need the backports-zstd package on this Python; send "
                                         "the body uncompressed or with gzip") from None
    # The window a frame's header asks for is allocated before a byte decodes: at most the cap's
    # (a larger one could only serve a body past it), but never under 8 MiB, what streaming
    # compressors ask for by default, so that a small cap still decodes their small bodies.
    window = min(MAX_WINDOW_LOG, max(MIN_WINDOW_LOG, math.ceil(math.log2(max(limit, 1)))))
    return _frames(body, limit, "zstd", "frame",
                   lambda: ZstdDecompressor(options={DecompressionParameter.window_log_max: window}), ZstdError,
                   declared=lambda frame: get_frame_info(frame).decompressed_size)


def _gzip(body: bytes, limit: int) -> bytes:
    return _frames(body, limit, "gzip", "member", lambda: zlib.decompressobj(wbits=31), zlib.error)


def _frames(body: bytes, limit: int, encoding: str, frame: str, decoder, failure, declared=None) -> bytes:
    """body's frames, one after another, decoded: at most limit bytes in all and MAX_FRAMES frames.
    declared(frame): the size a frame's header says it decodes to, or None; past the cap, refused unread."""
    out, size, rest = [], 0, body
    too_large = BodyEncodingError(413, f"the request body decodes ({encoding}) to more than {limit:,} bytes; "
                                       f"the daemon accepts at most {limit:,} (its --max-message-bytes, "
                                       "JEVANY_MAX_MESSAGE_BYTES)")
    try:
        for _ in range(MAX_FRAMES):
            if not rest:
                return b"".join(out)
            if declared is not None and (declared(rest) or 0) > limit - size:
                raise too_large
            d = decoder()
            piece = d.decompress(rest, limit - size + 1)
            size += len(piece)
            if size > limit:
                raise too_large
            out.append(piece)
            if not d.eof:
                raise BodyEncodingError(400, f"the {encoding} body ends inside a {frame}")
            rest = d.unused_data
    except failure as exc:
        raise BodyEncodingError(400, f"the body is not valid {encoding}: {exc}") from None
    if rest:
        raise BodyEncodingError(400, f"the body holds more than {MAX_FRAMES} {encoding} {frame}s")
    return b"".join(out)
