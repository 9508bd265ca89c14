"""The media checker process on its own: it never outlives the supervisor that started it."""
import json
import subprocess
import sys
from pathlib import Path

from tests.server.daemons import wait_for

SETTINGS = {"media_root": "/", "media_max_bytes": 1 << 20, "media_total_bytes": 1 << 20,
            "media_max_pixels": 1 << 20, "media_max_video_frames": 10}


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"     # exited; its new parent has not reaped it yet


def test_a_checker_whose_supervisor_died_before_hearing_its_hello_exits(tmp_path):
    # Nobody ever binds this endpoint, and the parent dies while the checker may still be
    # starting: it must still notice, and go.
    launch = (f"import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-m', "
              f"'jevany_daemon.media.checker', '--endpoint', 'ipc://{tmp_path}/nobody.sock', '--identity', 'm', "
              f"'--settings', {json.dumps(json.dumps(SETTINGS))}, '--parent', str(os.getpid())]); "
              f"print(p.pid, flush=True); sys.stdin.read()")
    parent = subprocess.Popen([sys.executable, "-c", launch], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    checker = int(parent.stdout.readline())
    assert not gone(checker)
    parent.kill()
    parent.wait(10)
    wait_for(lambda: gone(checker), 30, "the orphaned checker exiting")
