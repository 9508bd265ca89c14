"""The main job, end to end: a daemon on the built-in tiny model, concurrent client processes, batching stats.

Run by `make demo`. Starts `jevany-daemon serve` as a separate process,
fans out client processes that each send a stream of decide requests, prints
a few answers and the daemon's status table, then stops the daemon with
SIGTERM (it drains and exits 0).
"""
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time

from jevany_client import JevClient, JevTimeoutError
from jevany_client.cli import format_status

from jevany_daemon import workloads

CLIENTS, PER_CLIENT = 8, 6


def client_process(endpoint: str, bodies: list, out) -> None:
    with JevClient(endpoint, timeout=300) as client:
        out.put([(body, client.call("decide", body)) for body in bodies])


def wait_ready(endpoint: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    with JevClient(endpoint, timeout=1) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                sys.exit(f"daemon exited with code {proc.returncode}")
            try:
                if client.status()["state"] == "ready":
                    return
            except JevTimeoutError:
                pass          # no socket yet, or no reply yet
            time.sleep(0.2)   # loading; poll again shortly
    sys.exit("daemon did not become ready")


def main() -> int:
    run_dir = tempfile.mkdtemp(prefix="jevany-demo-")
    endpoint, control = f"ipc://{run_dir}/daemon.sock", f"ipc://{run_dir}/control.sock"
    daemon = subprocess.Popen([sys.executable, "-m", "jevany_daemon", "serve", "--bind", endpoint,
                               "--control", control, "--max-batch-size", "8"])
    try:
        wait_ready(endpoint, daemon)
        bodies = workloads.short(CLIENTS * PER_CLIENT, seed=2026)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        started = time.monotonic()
        procs = [ctx.Process(target=client_process, args=(endpoint, bodies[k::CLIENTS], out))
                 for k in range(CLIENTS)]
        for p in procs:
            p.start()
        answered = [pair for _ in procs for pair in out.get(timeout=600)]
        for p in procs:
            p.join()
        elapsed = time.monotonic() - started
        print(f"\n{len(answered)} requests from {CLIENTS} client processes in {elapsed:.1f}s\n")
        for body, result in answered[:3]:
            print("state:", json.dumps(body["state"])[:100])
            for qid, answer in result["answers"].items():
                print(f"  {qid}: {json.dumps(answer)[:110]}")
            print(f"  batch: {result['batch']}\n")
        with JevClient(endpoint, timeout=10) as client:
            print(format_status(client.status()))
    finally:
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(120)
    print(f"\ndaemon drained and exited with code {code}")
    os.rmdir(run_dir) if not os.listdir(run_dir) else None
    return code


if __name__ == "__main__":
    sys.exit(main())
