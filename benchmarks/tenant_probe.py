"""Whether one tenant can tell, by timing its own cache hits, which state another tenant sent.

    .venv/bin/python benchmarks/tenant_probe.py [--rounds 6] [--out PATH]

One daemon (default settings, the tiny qwen3 model, its HTTP gateway behind a
token) serves two tenants: the attacker, over HTTP with the token, and the
victim, on the ipc socket (another tenant: its uid's salt). Each round the
attacker sends three guessed records (long enough to be kept, differing only
in their last words), the victim sends one of them (the secret, drawn at
random), and the attacker times its three guesses again and names the
slowest: a victim's entry that replaced the attacker's would make that one
miss. Chance is 2 right of 6. Then the eviction share: the attacker keeps one
state, the victim floods the cache with eight others, and the attacker's
state is timed again (a hit, or evicted).
"""
import argparse
import http.client
import json
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Daemon, free_port, machine, write_result   # noqa: E402

from jevany_client import JevClient   # noqa: E402
from jevany_daemon.model.tiny import build_tiny_model   # noqa: E402

TOKEN = "tenant-probe-token"


def record(code: str) -> dict:
    # past the default prefix_min_tokens (384); the codes differ only at the end
    return {"state": " ".join(["patient", "history", "unremarkable"] * 150) + f" Diagnosis code: {code}",
            "questions": {"u": {"type": "noul"}}}


class Attacker:
    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def timed(self, body: dict) -> float:
        started = time.perf_counter()
        self.conn.request("POST", "/v1/systemone", json.dumps(body),
                          {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        reply = self.conn.getresponse()
        reply.read()
        assert reply.status == 200, reply.status
        return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="jv-tenant-"))
    model = build_tiny_model(root / "model", arch="qwen3", readout="choice")
    token = root / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    port = free_port()
    settings = argparse.Namespace(device="cpu", dtype="fp32",
                                  serve_args=["--http", f"127.0.0.1:{port}", "--http-token-file", str(token)])
    daemon = Daemon(model, settings, batch=1, policy="adaptive")
    try:
        attacker, victim = Attacker(port), JevClient(daemon.endpoint, timeout=120)
        for _ in range(50):          # the gateway may come up after the daemon reports ready
            try:
                attacker.timed(record("warm-up"))
                break
            except (ConnectionError, OSError):
                attacker = Attacker(port)
                time.sleep(0.2)
        rounds = []
        for n in range(args.rounds):
            daemon.control_client.clear_cache()
            codes = [f"K-{n}{rng.randrange(1000, 9999)}" for _ in range(3)]
            for code in codes:
                attacker.timed(record(code))
            secret = rng.choice(codes)
            victim.decide_request(record(secret))
            times = {code: attacker.timed(record(code)) for code in codes}
            guess = max(times, key=times.get)
            rounds.append({"secret": secret, "guess": guess, "ms": {c: round(t * 1000, 1) for c, t in times.items()}})
            print(f"round {n + 1}: secret {secret} guess {guess} "
                  + " ".join(f"{c} {t * 1000:.0f} ms" for c, t in times.items()), flush=True)
        right = sum(r["secret"] == r["guess"] for r in rounds)
        daemon.control_client.clear_cache()
        kept = record("mine")
        cold = attacker.timed(kept)
        warm = attacker.timed(kept)
        for i in range(8):
            victim.decide_request(record(f"flood-{i}"))
        after = attacker.timed(kept)
        print(f"{right} of {len(rounds)} guessed right (chance: {len(rounds) / 3:.0f}); the attacker's kept state: "
              f"{cold * 1000:.0f} ms cold, {warm * 1000:.0f} ms cached, {after * 1000:.0f} ms after another "
              "tenant's eight", flush=True)
        result = {"right": right, "rounds": rounds, "kept_state_ms": {"cold": round(cold * 1000, 1),
                  "cached": round(warm * 1000, 1), "after_flood": round(after * 1000, 1)}, **machine()}
        if args.out:
            write_result(result, args.out)
        victim.close()
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
