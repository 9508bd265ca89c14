"""The main job, end to end: a daemon on the starter model, concurrent client processes, batching, an eval.

Run by `make demo`. Trains the starter model into runs/starter if it is not
there yet (`jevany-daemon tiny-model --trained`, about a minute), starts
`jevany-daemon serve` on it as a separate process, fans out client processes
that each send a stream of held-out decide requests, prints a few answers
beside what was expected and the daemon's status table, scores the whole
held-out split through the daemon (accuracy and calibration), then stops the
daemon with SIGTERM (it drains and exits 0).

    python scripts/demo.py [--model DIR]    # DIR: any model; without heldout.jsonl there is no eval
"""
import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from jevany_client import JevClient, JevTimeoutError
from jevany_client.status_page import format_status

from jevany_daemon import workloads

CLIENTS, PER_CLIENT = 8, 6
ROOT = Path(__file__).resolve().parent.parent
STARTER = ROOT / "runs" / "starter"


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


def describe_answer(qid: str, answer: dict, label=None) -> str:
    """One line a person reads: the decision, how sure the model was, and what the suite expected."""
    kind = answer.get("type")
    if kind == "choice":
        line = f"{qid} (choice): {answer['choice']}, confidence {answer['confidence']:.2f}"
    elif kind == "noul":
        line = f"{qid} (yes/no): {answer['noul']:.2f} that it is yes"
    else:
        line = f"{qid} (score): {answer['score']:.2f} on a 0-{len(answer['probabilities']) - 1} scale, " \
               f"confidence {answer['confidence']:.2f}"
    return line if label is None else f"{line}   [expected: {json.dumps(label)}]"


def describe_batch(batch: dict) -> str:
    others = batch["size"] - 1
    shared = f"shared its forward pass with {others} other request{'s' * (others != 1)}" if others else \
        "had a forward pass to itself"
    return f"{shared} ({batch['padded_tokens']} tokens computed, padding included)"


def starter_model(model: Path) -> Path:
    """The model to serve: the starter model is trained on first use; any other must exist."""
    if model != STARTER or (model / "head.pt").is_file():
        return model
    from jevany_daemon.starter.build import StageLines, build_trained_model
    from jevany_daemon.starter.evaluate import format_report

    print(f"Training the starter model into {model} (once; under a minute on 2 idle CPU cores) ...", flush=True)
    figures = build_trained_model(model, progress=StageLines(sys.stdout))     # each stage, then steps and loss
    print(f"trained in {figures['train_seconds']:.0f} s; held-out figures measured in-process:")
    print(textwrap.indent(format_report(figures["heldout"]), "  "))
    return model


def suite_of(model: Path, n: int) -> tuple[list[dict], list[dict]]:
    """(labelled held-out items, n bodies to send): the model's held-out suite, or random requests."""
    from jevany_daemon.starter import suite

    if not (model / "heldout.jsonl").is_file():
        return [], workloads.short(n, seed=2026)
    items = suite.read_jsonl(model / "heldout.jsonl")
    return items, [suite.body(item) for item in items[:n]]


def eval_report(endpoint: str, suite_path: Path, run_dir: str) -> None:
    """jevany-eval on the held-out split: every item through the daemon, then the report against the labels."""
    from jevany_client.eval import Options, evaluate

    print(f"\nEval of the held-out split ({suite_path}: items the model never trained on), "
          "as `jevany-eval` runs it:\n", flush=True)
    evaluate(Options(suite=str(suite_path), endpoints=[endpoint], out=os.path.join(run_dir, "heldout.results.jsonl"),
                     progress=False))
    print(textwrap.fill("ECE is the expected calibration error: how far, on average, the probability of each "
                        "answer is from how often answers that sure are right (0: perfectly calibrated).", 88))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=STARTER, help=f"model to serve [default: {STARTER}]")
    model = starter_model(parser.parse_args().model)
    items, bodies = suite_of(model, CLIENTS * PER_CLIENT)
    run_dir = tempfile.mkdtemp(prefix="jevany-demo-")
    endpoint, control = f"ipc://{run_dir}/daemon.sock", f"ipc://{run_dir}/control.sock"
    daemon = subprocess.Popen([sys.executable, "-m", "jevany_daemon", "serve", "--model", str(model),
                               "--bind", endpoint, "--control", control, "--max-batch-size", "8"])
    try:
        wait_ready(endpoint, daemon)
        with JevClient(endpoint, timeout=10) as client:
            before = client.status()["batching"]
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
        labels = {json.dumps(item["state"], sort_keys=True): item["labels"] for item in items}
        print("\nSome answers:")
        for body, result in answered[:3]:
            state = body["state"] if isinstance(body["state"], str) else json.dumps(body["state"])
            expected = labels.get(json.dumps(body["state"], sort_keys=True), {})
            print(f"\n  state: {textwrap.shorten(state, 100, placeholder=' ...')}")
            for qid, answer in result["answers"].items():
                print(f"    {describe_answer(qid, answer, expected.get(qid))}")
            print(f"    this request {describe_batch(result['batch'])}")
        print("\nThe daemon's status (jevany-ctl status shows the same):\n")
        print(format_status(status))
        if items:
            eval_report(endpoint, model / "heldout.jsonl", run_dir)
        print("\nNext: serve a real checkpoint (docs/SERVING.md, Running the daemon), send your own requests "
              "(docs/REQUESTS.md), measure (make bench).")
    finally:
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(120)
    print(f"\ndaemon drained and exited with code {code}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
