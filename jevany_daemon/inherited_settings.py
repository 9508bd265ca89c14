"""Settings handed to a child process through an inherited descriptor, never its command line.

Every local user can read every process's command line (/proc/PID/cmdline,
ps), and the settings name files an operator may not want named (the HTTP
token file, key files, the media root). A child started with --settings-fd N
reads them from an anonymous file (a memfd) it inherits, which no other
process can open by name.
"""
import json
import os


def settings_fd(settings: dict) -> int:
    """A descriptor holding settings as JSON, read from its start, for Popen's pass_fds (which alone makes
    it the child's: close-on-exec otherwise, so no other process started meanwhile inherits it); the caller
    closes it."""
    fd = os.memfd_create("jevany-settings", os.MFD_CLOEXEC)
    try:
        view = memoryview(json.dumps(settings).encode())
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_settings(settings_json: str | None, fd: int | None) -> dict:
    """A child's settings: from --settings-fd (read whole, then closed), else the --settings JSON."""
    if fd is None:
        return json.loads(settings_json)
    with os.fdopen(fd, "rb") as f:
        return json.loads(f.read())
