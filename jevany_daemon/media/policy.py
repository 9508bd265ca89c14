"""The media policy: JevAny's rules for which files a request may name, and how big they may be.

Media is off unless the operator sets a root (JEVANY_MEDIA_ROOT). A URI is a
path: relative ones resolve inside the root, symlinks are followed, and the
result must stay inside the root and be a regular file: the one the kernel
opened at exactly that path (files.opened_as: not through a directory
swapped for a symlink meanwhile, not under /proc), readable by everyone if
it has other hard links. A URI's bytes are the name, never normalised (NFC,
NFKC); one with a NUL, or a lone surrogate (no bytes), is refused. Then the
caps: bytes per file, bytes per request, pixels per image or video frame,
frames per video. Each refusal has its own message, JevAny's word for word
where JevAny has the rule, so callers that match on them keep working. Each
file is read once (files.py: no FIFO, no final symlink, nothing past the
byte cap), its bytes checked (checks.py) and their digest reported, so the
worker can tell it decodes those same bytes.

Images sent in an HTTP request's body (the Jev API's multipart assets) are
written by the gateway into the daemon's own uploads directory (0700, in its
private run directory, under names nobody can guess) for as long as their
request runs; a path there passes as if it were inside the root, and every
other rule and cap applies to it as to any file.
"""
import os
from dataclasses import dataclass
from pathlib import Path

from jevany_client.errors import InvalidRequestError

from . import checks
from .files import read_regular, stamp

MEDIA_TYPES = ("image", "video")


def uploads_dir(rundir: str) -> str:
    """Where the gateway writes a request's uploaded images, in the supervisor's run directory."""
    return os.path.join(rundir, "uploads")


@dataclass(frozen=True)
class MediaPolicy:
    root: str | None
    max_bytes: int = 50 << 20
    total_bytes: int = 100 << 20
    max_pixels: int = 4096 * 4096
    max_video_frames: int = 3600
    uploads: str | None = None        # the uploads directory (uploads_dir), for images sent in a body

    @classmethod
    def from_settings(cls, settings: dict, uploads: str | None = None) -> "MediaPolicy":
        """From ServeSettings.to_dict() (what workers and the gateway are given)."""
        return cls(settings.get("media_root"), settings["media_max_bytes"], settings["media_total_bytes"],
                   settings["media_max_pixels"], settings["media_max_video_frames"], uploads)

    @property
    def enabled(self) -> bool:
        return bool(self.root)

    def limits(self, media_types) -> dict:
        """What /v1/models reports, under JevAny's names."""
        return {"media_enabled": self.enabled and bool(media_types), "media_max_file_bytes": self.max_bytes,
                "media_max_total_bytes": self.total_bytes, "media_max_pixels": self.max_pixels,
                "media_max_video_frames": self.max_video_frames}

    def resolve(self, items) -> list[tuple[str, Path]]:
        """[(type, uri)...] → [(type, resolved path)...], every rule and cap checked; the first
        broken one raises InvalidRequestError with JevAny's message."""
        return [(kind, path) for kind, path, _ in self.check(items)]

    def check(self, items) -> list[tuple[str, Path, list]]:
        """resolve(), with the stamp (size, SHA-256) of the bytes each file was checked on."""
        if not self.enabled:
            raise refused("media is disabled; the server operator must set JEVANY_MEDIA_ROOT")
        try:
            root = Path(self.root).resolve(strict=True)
        except (OSError, RuntimeError):
            raise refused("configured media root is unavailable") from None
        if not root.is_dir():
            raise refused("configured media root is not a directory")
        resolved, total = [], 0
        for kind, uri in items:
            path = _inside(root, uri, self.uploads)
            data = read_regular(path, self.max_bytes, placed=True)
            total += len(data)
            if total > self.total_bytes:
                raise refused(f"media files exceed {self.total_bytes} bytes in total")
            checks.check(kind, data, self.max_pixels, self.max_video_frames)
            resolved.append((kind, path, stamp(data)))
        return resolved


def _inside(root: Path, uri: str, uploads: str | None = None) -> Path:
    if "://" in uri:
        raise refused("network media URIs are not allowed")
    # A path is the bytes the kernel compares, never normalised here (a fullwidth solidus is no
    # separator, a lookalike dot no dot): what is checked is what is opened. Only a name that has
    # no such bytes is refused: a NUL would end it early, a lone surrogate has no UTF-8.
    if "\0" in uri:
        raise refused("media path contains a NUL byte")
    try:
        os.fsencode(uri)
    except UnicodeError:
        raise refused("media path is not a valid file name") from None
    candidate = Path(uri)
    try:
        path = (candidate if candidate.is_absolute() else root / candidate).resolve(strict=True)
    except PermissionError:
        raise refused("server cannot access media file; check shared directory and file permissions") from None
    except (OSError, RuntimeError):      # missing, or a symlink loop
        raise refused("media file does not exist") from None
    if not (path.is_relative_to(root) or (uploads is not None and path.parent == Path(uploads).resolve())):
        raise refused("media path is outside JEVANY_MEDIA_ROOT")
    if not path.is_file():
        raise refused("media path is not a regular file")
    if not os.access(path, os.R_OK):
        raise refused("server cannot access media file; check shared directory and file permissions")
    return path


def refused(message: str) -> InvalidRequestError:
    return InvalidRequestError(message)
