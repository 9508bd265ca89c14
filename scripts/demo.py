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
import textwrap
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


def describe_answer(qid: str, answer: dict) -> str:
    """One line a person reads: the decision, and how sure the model was."""
    kind = answer.get("type")
    if kind == "choice":
        return f"{qid} (choice): {answer['choice']}, confidence {answer['confidence']:.2f}"
    if kind == "noul":
        return f"{qid} (yes/no): {answer['noul']:.2f} that it is yes"
    return f"{qid} (score): {answer['score']:.2f} on a 0-{len(answer['probabilities']) - 1} scale, " \
           f"confidence {answer['confidence']:.2f}"


def describe_batch(batch: dict) -> str:
    others = batch["size"] - 1
    shared = f"shared its forward pass with {others} other request{'s' * (others != 1)}" if others else \
        "had a forward pass to itself"
    return f"{shared} ({batch['padded_tokens']} tokens computed, padding included)"


def main() -> int:
    run_dir = tempfile.mkdtemp(prefix="jevany-demo-")
    endpoint, control = f"ipc://{run_dir}/daemon.sock", f"ipc://{run_dir}/control.sock"
    daemon = subprocess.Popen([sys.executable, "-m", "jevany_daemon", "serve", "--bind", endpoint,
                               "--control", control, "--max-batch-size", "8"])
    try:
        wait_ready(endpoint, daemon)
        with JevClient(endpoint, timeout=10) as client:
            before = client.status()["batching"]
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
        with JevClient(endpoint, timeout=10) as client:
            status = client.status()
        after = status["batching"]
        passes, scored = after["batches"] - before["batches"], after["requests"] - before["requests"]
        print(f"\nWhat ran: {len(answered)} decide requests from {CLIENTS} client processes at once, "
              f"answered in {elapsed:.1f} s.")
        print(f"How they batched: {scored} requests in {passes} forward passes, "
              f"{scored / max(1, passes):.1f} requests a pass on average.")
        if scored / max(1, passes) < 2:
            print(textwrap.fill(
                "Most passes held one request: on a CPU the adaptive batch policy batches a length class "
                "only once batched passes have measured faster there, and a short run like this one "
                "is mostly its first measurements (--batch-policy greedy always batches).", 88))
        if status["model"].get("random_weights"):
            print("The model is the built-in demo with RANDOM weights: the answers below show the shape "
                  "of a reply, not a decision anyone should use.")
        print("\nSome answers:")
        for body, result in answered[:3]:
            state = body["state"] if isinstance(body["state"], str) else json.dumps(body["state"])
            print(f"\n  state: {textwrap.shorten(state, 80, placeholder=' ...')}")
            for qid, answer in result["answers"].items():
                print(f"    {describe_answer(qid, answer)}")
            print(f"    this request {describe_batch(result['batch'])}")
        print("\nThe daemon's status (jevany-ctl status shows the same):\n")
        print(format_status(status))
        print("\nNext: serve a real checkpoint (README, Running the daemon), send your own requests "
              "(docs/REQUESTS.md), measure (make bench).")
    finally:
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(120)
    print(f"\ndaemon drained and exited with code {code}")
    os.rmdir(run_dir) if not os.listdir(run_dir) else None
    return code


if __name__ == "__main__":
    sys.exit(main())
