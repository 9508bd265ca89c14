"""systemd: the unit verifies, the environment file documents every setting, sd_notify speaks the protocol."""
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jevany_daemon.server.sdnotify import Notifier
from jevany_daemon.server.settings import ENGINE_FIELDS, LOAD_FIELDS, SERVE_FIELDS, SETTINGS
from jevany_daemon.settings_table import OTHER_VARIABLES

from ..docs import DOCS, pages, section

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "jevany-daemon.service"
ENV_FILE = ROOT / "systemd" / "jevany-daemon.env"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart exists, so point it at this checkout's jevany-daemon.
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/jevany/.venv/bin/jevany-daemon",
                                             str(Path(sys.executable).parent / "jevany-daemon")))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if UNIT.name in line]
    assert proc.returncode == 0 and complaints == [], proc.stdout + proc.stderr


def test_the_unit_has_what_operations_rely_on():
    directives = dict(line.split("=", 1) for line in UNIT.read_text().splitlines()
                      if "=" in line and not line.startswith("#"))
    assert directives["Type"] == "notify" and directives["KillMode"] == "mixed"
    assert directives["Restart"] == "on-failure" and directives["RuntimeDirectoryMode"] == "0750"
    assert directives["NoNewPrivileges"] == "yes" and directives["ProtectSystem"] == "strict"
    for name in ("WatchdogSec", "RuntimeDirectory", "Group", "EnvironmentFile", "ReadWritePaths",
                 "ProtectHome", "PrivateTmp", "ExecReload"):
        assert directives.get(name), name


def test_every_cache_the_unit_names_is_one_it_lets_the_daemon_write():
    """ProtectSystem=strict leaves the service user's home read-only: Triton's default cache there
    (~/.triton) would fail every kernel build of a hybrid model on a GPU."""
    lines = [line for line in UNIT.read_text().splitlines() if "=" in line and not line.startswith("#")]
    writable = [f"/var/cache/{line.split('=', 1)[1]}" for line in lines if line.startswith("CacheDirectory=")]
    writable += [line.split("=", 1)[1].lstrip("-") for line in lines if line.startswith("ReadWritePaths=")]
    settings = dict(item.split("=", 1) for line in lines if line.startswith("Environment=")
                    for item in line.removeprefix("Environment=").split())
    for name in ("JEVANY_CACHE_DIR", "HF_HOME", "TRITON_CACHE_DIR"):
        path = Path(settings[name])
        assert any(path == Path(w) or Path(w) in path.parents for w in writable), (name, path, writable)


def test_the_install_steps_match_the_unit():
    """What the unit points at is what the install steps (docs/OPERATING.md, "systemd") install, and a CPU
    host never pulls the CUDA torch."""
    steps = section(DOCS / "OPERATING.md", "systemd")
    steps = steps[:steps.index("```", steps.index("```sh") + 5)]
    directives = dict(line.split("=", 1) for line in UNIT.read_text().splitlines()
                      if "=" in line and not line.startswith("#"))
    documentation = directives["Documentation"].removeprefix("file://")
    assert f"docs/OPERATING.md {documentation}" in steps                     # installed where the unit looks
    assert "pip install -c constraints-cpu.txt" in steps
    env_file = directives["EnvironmentFile"].lstrip("-")
    assert f"install -D -m 0640 -g jevany systemd/jevany-daemon.env {env_file}" in steps   # -D makes /etc/jevany
    for page in pages():                                              # the service user has no PATH to find it
        assert "sudo -u jevany jevany-ctl" not in page.read_text(), page.name


def test_the_environment_file_documents_every_setting():
    text = ENV_FILE.read_text()
    for name in SERVE_FIELDS + ENGINE_FIELDS + LOAD_FIELDS:
        assert f"JEVANY_{name.upper()}" in text, name
    for name in ("JEVANY_LOG_LEVEL", "JEVANY_CACHE_DIR", "JEVANY_ENDPOINT", "JEVANY_CONTROL_ENDPOINT"):
        assert name in text


def test_every_variable_the_environment_file_names_is_a_declared_one():
    """A variable renamed or removed from the declarations, or mistyped here, would be silently ignored."""
    declared = {s.variable for s in SETTINGS if s.env} | {name for name, _, _ in OTHER_VARIABLES}
    named = set(re.findall(r"\bJEVANY_[A-Z0-9_]*[A-Z0-9]\b", ENV_FILE.read_text()))
    assert len(named) > 50 and not named - declared, sorted(named - declared)


def listen(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(0.5)
    return sock


def test_notifier_abstract_namespace_and_watchdog_rules():
    name = f"jevany-test-{os.getpid()}"
    with listen("\0" + name) as server:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "3000000"})
        assert notifier.enabled and notifier.watchdog_s == 1.5
        notifier.ready("serving")
        notifier.watchdog()
        assert server.recv(4096).decode().split("\n")[:2] == ["READY=1", "STATUS=serving"]
        assert server.recv(4096) == b"WATCHDOG=1"
        notifier.close()
    assert Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "1"}).watchdog_s is None
    quiet = Notifier({})
    assert not quiet.enabled and quiet.watchdog_s is None
    quiet.ready("nobody listens")      # a no-op outside systemd


def test_the_daemon_notifies_ready_status_watchdog_then_stopping_and_sets_socket_modes(start_daemon, tmp_path):
    address = f"/tmp/jvn-{os.getpid()}.sock"
    messages = []
    with listen(address) as server:
        try:
            daemon = start_daemon("--socket-mode", "0660", ready=False,
                                  env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"})

            def until(predicate, within_s=60):
                deadline = time.monotonic() + within_s
                while time.monotonic() < deadline:
                    try:
                        messages.append(server.recv(4096).decode())
                    except TimeoutError:
                        assert daemon.proc.poll() is None, daemon.log.read_text()
                        continue
                    if predicate(messages[-1]):
                        return len(messages) - 1
                raise AssertionError(f"no such message within {within_s}s: {messages}")

            ready = until(lambda m: "READY=1" in m)
            status = until(lambda m: m.startswith("STATUS="))
            watchdog = until(lambda m: m == "WATCHDOG=1")
            assert len([w for w in daemon.workers() if w["state"] == "idle"]) == 1
            # As under systemd with a client group: the public socket group-writable, control owner-only.
            assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o660
            assert stat.S_IMODE((daemon.dir / "c.sock").stat().st_mode) == 0o600
            worker_pid = daemon.workers()[0]["pid"]
            assert b"NOTIFY_SOCKET" not in Path(f"/proc/{worker_pid}/environ").read_bytes()
            daemon.proc.send_signal(signal.SIGTERM)
            stopping = until(lambda m: "STOPPING=1" in m)
            assert daemon.proc.wait(60) == 0
        finally:
            os.unlink(address)
    assert ready < status < stopping and ready < watchdog < stopping
    assert f"MAINPID={daemon.proc.pid}" in messages[ready]
    assert "queue 0/1024" in messages[status] and "decide/s" in messages[status]
    assert not any("READY=1" in m for m in messages[:ready])
