"""Images sent in a request's body, the Jev API's way: a multipart/form-data body whose `request` part is
the JSON request, whose `assets` map names each image's part (typesafe-sdk's `Image`).

The guard splits such a body (its size already within --max-message-bytes)
into the JSON the route reads and the parts, which ride along in the ASGI
scope. The route writes each claimed part into the daemon's uploads
directory (media/policy.py: 0700, in its private run directory) under a name
nobody can guess, names it in the request's `media` as JevAny's entries do,
and removes the files once the request is answered. From there the media
checker applies every rule and cap it applies to a file under --media-root,
and the worker decodes its own private copy. A deployment without a media
root refuses them with JevAny's message.

A file system with no room left (ENOSPC, EDQUOT: the run directory is
often a small tmpfs, shared with other services) is the daemon's state,
not the request's: the caller gets `overloaded`, retryable (429 with
Retry-After), and whatever was written of the request's images is removed
at once. Uploads leave as their requests are answered, so room comes back.
"""
import errno
import os
import uuid
from email.parser import BytesParser
from email.policy import HTTP

from jevany_client.errors import InvalidRequestError, OverloadedError

SCOPE_KEY = "jevany.assets"     # where the guard leaves the parts for the route
REQUEST_PART = "request"
MAX_PARTS = 33                  # the request and 32 images (shapes.MAX_MEDIA)
MEDIA_DISABLED = "media is disabled; the server operator must set JEVANY_MEDIA_ROOT"
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


class UploadsFull(OverloadedError, InvalidRequestError):
    """No room to keep an uploaded image now: overloaded's code and retry advice. An InvalidRequestError
    too, only so the route that answers the assets' other refusals answers this one by its code."""


def split(body: bytes, content_type: str) -> tuple[bytes, dict[str, tuple[str, bytes]]]:
    """(the request part's JSON, {part name: (content type, bytes)} for the others); a body that is not
    such a form raises InvalidRequestError."""
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode("latin-1")
                                                  + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise InvalidRequestError("the multipart body has no parts (or no boundary)")
    request, parts = None, {}
    for count, part in enumerate(message.iter_parts(), 1):
        if count > MAX_PARTS:
            raise InvalidRequestError(f"a request carries at most {MAX_PARTS - 1} images")
        name = part.get_param("name", header="content-disposition")
        if not name:
            raise InvalidRequestError("every part of a multipart body needs a name (Content-Disposition)")
        data = part.get_payload(decode=True) or b""
        if name == REQUEST_PART:
            request = data
        elif name in parts:
            raise InvalidRequestError(f"the part {name!r} comes twice")
        else:
            parts[name] = (part.get_content_type(), data)
    if request is None:
        raise InvalidRequestError(f"a multipart body needs a part named {REQUEST_PART!r}: the JSON request")
    return request, parts


class Uploads:
    """The uploads directory, as the gateway writes it (None: media is off here)."""

    def __init__(self, directory: str | None):
        self.directory = directory

    def place(self, assets: dict, parts: dict[str, tuple[str, bytes]] | None) -> list[str]:
        """Write each asset's part as a file of its own; their paths, in the assets' order. Each part is
        claimed by exactly one asset (the Jev API's rule)."""
        if self.directory is None:
            raise InvalidRequestError(MEDIA_DISABLED)
        if parts is None:
            raise InvalidRequestError("assets name parts of a multipart/form-data body; this body is JSON")
        claimed = []
        for name, asset in assets.items():
            if not isinstance(asset, dict) or asset.get("type") != "image" or not isinstance(asset.get("part"), str):
                raise InvalidRequestError(f"asset {name!r} must be {{\"type\": \"image\", \"part\": NAME}}")
            if asset["part"] not in parts:
                raise InvalidRequestError(f"asset {name!r} names part {asset['part']!r}, which the body lacks")
            claimed.append(asset["part"])
        if sorted(claimed) != sorted(parts) or len(set(claimed)) != len(claimed):
            raise InvalidRequestError("each part must be claimed by exactly one asset")
        paths: list[str] = []
        try:
            for part in claimed:
                paths.append(self._write(parts[part][1]))
        except OSError as exc:
            self.remove(paths)
            if exc.errno in NO_ROOM:
                raise UploadsFull(f"the daemon has no room to keep the uploaded image ({exc.strerror}); "
                                  "retry later") from None
            raise InvalidRequestError(f"the uploaded image could not be kept for checking: {exc.strerror}") from None
        return paths

    def _write(self, data: bytes) -> str:
        path = os.path.join(self.directory, uuid.uuid4().hex)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)        # which may report the failure itself (a quota on NFS)
        except BaseException:
            self.remove([path])     # a part written before the disk filled is nobody's: not left behind
            raise
        return path

    @staticmethod
    def remove(paths: list[str]) -> None:
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
