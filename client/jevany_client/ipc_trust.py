"""Whether an ipc socket's path can be trusted: nobody else can put another socket there.

A socket file is only as safe as the directories above it. Whoever may write
to one of them can rename the daemon's directory away and put a socket of
their own in its place, then read every request and forge every answer. The
default endpoint lives under a shared /tmp (/tmp/jevany-UID/jevany/), where
another local user may create the predictable directory first.

So, as ssh-agent and tmux check their socket directories, the daemon before
binding and the client before sending both walk the path from / down:

- no component may be a symlink (another user could point it anywhere);
- a directory writable by group or others is refused, unless it is sticky
  and owned by root, as /tmp is (there nobody can rename another's entry);
- below such a shared directory, every directory must belong to the user
  checking (or root): a directory someone else made first is theirs to swap.

Missing components are not a problem here (the daemon creates them; a
client then finds no socket); the first unsafe one is.
"""

import functools
import os
import stat
from pathlib import Path


def ipc_problem(path: Path, uid: int | None = None) -> str | None:
    """Why a socket at path could be swapped by another user, or None when it cannot."""
    return _walk(path, os.getuid() if uid is None else uid)[0]


def _directories(path) -> tuple[str, ...]:
    """Every directory above path, from the top: plain strings (a client checks before every call)."""
    return _above(os.path.dirname(os.path.abspath(path)))


@functools.lru_cache(maxsize=256)
def _above(directory: str) -> tuple[str, ...]:
    # The names only, kept per directory: what each of them is, is looked up again at every check.
    out, current = [], ""
    for part in directory.split("/"):
        if part:
            current = f"{current}/{part}"
            out.append(current)
    return tuple(out)


def _walk(path, uid: int) -> tuple[str | None, bool, bool]:
    """(the first unsafe directory's problem or None, whether one above is shared like /tmp,
    whether every directory exists)."""
    shared = False
    for current in _directories(path):
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return None, shared, False       # made by the daemon below here, with safe modes
        except OSError as exc:
            return f"{current} cannot be checked ({exc.strerror})", shared, False
        problem = _directory_problem(current, st, uid, shared)
        if problem is not None:
            return problem, shared, True
        shared = shared or _is_shared(st)
    return None, shared, True


def _directory_problem(path: Path, st: os.stat_result, uid: int, below_shared: bool) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink (owned by uid {st.st_uid}); a socket path must not go through one"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if below_shared and (problem := _owner_problem(path, st, uid)):
        return f"{problem}; whoever made it can swap the socket inside"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not _is_shared(st):
        return (f"{path} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); anyone who may write there can swap the socket")
    return None


def _is_shared(st: os.stat_result) -> bool:
    """A directory like /tmp: writable by others, sticky, owned by root."""
    return bool(st.st_mode & stat.S_IWOTH and st.st_mode & stat.S_ISVTX) and st.st_uid == 0


def socket_file_problem(path: Path, uid: int | None = None) -> str | None:
    """ipc_problem, and the socket file itself: under a shared directory it must be the user's or root's."""
    uid = os.getuid() if uid is None else uid
    problem, shared, found = _walk(path, uid)
    if problem is not None or not found:
        return problem
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return _owner_problem(path, st, uid) if shared else None


def _owner_problem(path, st: os.stat_result, uid: int) -> str | None:
    """Under a shared directory, what is not the user's or root's is someone else's to swap."""
    if st.st_uid in (uid, 0):
        return None
    return f"{path} belongs to uid {st.st_uid}, not to uid {uid}, in a directory everyone may write to"
