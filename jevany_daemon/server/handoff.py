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
    """An inheritable descriptor holding settings as JSON, read from its start; the caller closes it."""
    fd = os.memfd_create("jevany-settings", 0)      # no MFD_CLOEXEC: the child inherits it
    data = json.dumps(settings).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def read_settings(settings_json: str | None, fd: int | None) -> dict:
    """A child's settings: from --settings-fd (read whole, then closed), else the --settings JSON."""
    if fd is None:
        return json.loads(settings_json)
    with os.fdopen(fd, "rb") as f:
        return json.loads(f.read())
