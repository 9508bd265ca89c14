"""The Node.js client in examples/node checks a real daemon's replies against PROTOCOL.md.

Runs when `node` is on PATH and examples/node/node_modules is installed
(`make test` runs `npm ci` there when npm is present); skips otherwise.
"""
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parents[2] / "examples" / "node"
NODE = shutil.which("node")
INSTALLED = all((NODE_DIR / "node_modules" / pkg / "package.json").is_file() for pkg in ("zeromq", "@msgpack/msgpack"))

pytestmark = pytest.mark.skipif(NODE is None or not INSTALLED,
                                reason="needs node and `npm ci` in examples/node")


def run_client(endpoint: str, timeout_ms: int = 60_000) -> subprocess.CompletedProcess:
    return subprocess.run([NODE, "client.js", endpoint], cwd=NODE_DIR, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "JEVANY_NODE_TIMEOUT_MS": str(timeout_ms)})


def test_the_node_client_finds_every_reply_as_the_protocol_says(shared_daemon):
    done = run_client(shared_daemon.endpoint)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith(", 0 mismatches")
    checks = int(done.stdout.split("node client: ")[1].split(" checks")[0])
    assert checks > 150


def test_the_node_client_fails_when_no_daemon_answers(tmp_path):
    done = run_client(f"ipc://{tmp_path}/nobody.sock", timeout_ms=300)
    assert done.returncode == 2 and "no reply" in done.stderr
