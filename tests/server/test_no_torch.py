"""The supervisor must never import torch: a CUDA fault in a worker cannot take the sockets down."""
import subprocess
import sys


def test_supervisor_and_cli_import_no_torch():
    code = ("import sys, jevany_daemon.server.supervisor, jevany_daemon.cli; "
            "bad = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_supervisor_imports_no_http_stack_and_the_gateway_no_torch():
    # The supervisor does not learn HTTP; the gateway is a torch-free client of it.
    code = ("import sys, jevany_daemon.server.supervisor; "
            "bad = [m for m in ('fastapi', 'uvicorn', 'starlette', 'pydantic') if m in sys.modules]; "
            "import jevany_daemon.gateway.process; "
            "bad += [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
