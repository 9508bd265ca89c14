"""The supervisor must never import torch: a CUDA fault in a worker cannot take the sockets down."""
import subprocess
import sys


def test_supervisor_and_cli_import_no_torch():
    code = ("import sys, jevany_daemon.server.supervisor, jevany_daemon.cli; "
            "bad = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
