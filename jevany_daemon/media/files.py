"""Reading a media file once, safely, and keeping what was read.

Between the media checker's look at a file and the worker's decode, the path
may come to name something else: a FIFO renamed over it (opening that blocks
until a writer comes, and a worker blocked in open() answers nobody), a
symlink, or the same file rewritten in place with its size, time and inode
put back. So the path is never trusted twice:

- a file is opened once, without blocking (O_NONBLOCK: a FIFO opens at once)
  and without following a final symlink (O_NOFOLLOW), and what the
  descriptor is (fstat) decides: only a regular file is read, and only up to
  the size cap;
- the checker checks those bytes and reports their SHA-256; the worker reads
  the file again the same way and refuses it unless the digest matches, then
  decodes its own private copy (a memfd no other process can open by name),
  never the path.

The checker also asks the descriptor where it is (policy.py gives it a path
already resolved, symlinks and all): the file the kernel opened must be the
one at exactly that path, not one a directory swapped for a symlink led to
in the meantime, nor a process's file under /proc; and a file with other
hard links (another name, perhaps outside the root, that the client could
not read) is read only if everyone may read it anyway.
"""
import hashlib
import os
import stat

from jevany_client.errors import InvalidRequestError

CHANGED = "media file changed after it was checked; send the request again"
MOVED = "media path changed while it was opened; send the request again"
LINKED = ("media file has other hard links and is not readable by everyone; put a copy of it in "
          "JEVANY_MEDIA_ROOT")
IN_PROC = "media path is under /proc: a process's own files, not media"
_CHUNK = 1 << 20


def read_regular(path, max_bytes: int, placed: bool = False) -> bytes:
    """The file's bytes, from one descriptor opened without blocking or following a final symlink;
    placed: path is resolved (no symlink, no ..), and the descriptor must be what opened_as() allows."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except PermissionError:
        raise InvalidRequestError("server cannot access media file; check shared directory and file "
                                  "permissions") from None
    except OSError:
        raise InvalidRequestError("media path is not a regular file") from None   # now a symlink, or gone
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidRequestError("media path is not a regular file")
        if placed:
            opened_as(fd, st, path)
        if st.st_size > max_bytes:
            raise InvalidRequestError(f"media file exceeds {max_bytes} bytes")
        chunks, size = [], 0
        while size <= max_bytes:        # the size may grow while it is read: the cap holds on what is read
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise InvalidRequestError(f"media file exceeds {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def opened_as(fd: int, st: os.stat_result, path) -> None:
    """Refuse a descriptor that is not the file at path itself, or that other names reach unseen."""
    try:
        # The kernel's name for what it opened: the path walked, whatever it met on the way.
        where = os.readlink(f"/proc/self/fd/{fd}")
        proc = os.stat("/proc").st_dev
    except OSError:
        raise InvalidRequestError("media file could not be validated") from None     # no /proc to ask
    if where != os.fspath(path):
        raise InvalidRequestError(MOVED)
    if st.st_dev == proc:
        # Only a media root of / (or /proc) gets here; /proc/self names whichever process reads it.
        raise InvalidRequestError(IN_PROC)
    if st.st_nlink > 1 and not st.st_mode & stat.S_IROTH:
        # A hard link is a name as good as any other, and nothing tells which came first: another
        # user's private file may have been linked in (where protected_hardlinks is off, or on a
        # share another host writes). One everyone may read gives nobody anything new.
        raise InvalidRequestError(LINKED)


def stamp(data: bytes) -> list:
    """What the worker is told of checked bytes: their size and SHA-256."""
    return [len(data), hashlib.sha256(data).hexdigest()]


def read_verified(path, checked: list) -> bytes:
    """The file's bytes if they are the ones the checker checked (stamp()), else the 'changed' refusal."""
    size, expected = checked
    try:
        data = read_regular(path, size)
    except InvalidRequestError:
        raise InvalidRequestError(CHANGED) from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != expected:
        raise InvalidRequestError(CHANGED)
    return data


class PrivateCopies:
    """Checked bytes as files only this process can reach (memfds), by a path a decoder can open.

    Closed once the request is scored; the memory goes with the descriptor, even if the
    process dies first.
    """

    def __init__(self):
        self.fds: list[int] = []

    def add(self, data: bytes) -> str:
        fd = os.memfd_create("jevany-media", os.MFD_CLOEXEC)
        self.fds.append(fd)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return f"/proc/self/fd/{fd}"

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
