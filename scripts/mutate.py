"""The mutation check: plant plausible one-line bugs, one at a time, and see whether the tests catch them.

    python scripts/mutate.py                 # every mutation in MUTATIONS (make mutate)
    python scripts/mutate.py --only batching policy --list
    python scripts/mutate.py --timeout 300   # seconds a mutation's tests may take

Each mutation names a file, a line of it as it is and as the bug would write
it, and the tests that cover that module. The line must occur exactly once
(else the list has rotted, and the check says so). The mutated file is
written in place, the tests run in a child pytest (-x, stop at the first
failure), and the file is put back whatever happens, also on Ctrl-C. A
mutation is killed when its tests fail, survives when they pass; a run past
--timeout counts as killed (the bug made something hang) and is reported
apart. Prints each outcome, the score (killed / total) and the survivors;
exit status 0 when the score reaches --require (default 0.95), else 1.
Not part of `make test`: it runs the covering tests once per mutation.
"""
import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    before: str
    after: str
    tests: tuple[str, ...]


def m(name, path, before, after, *tests) -> Mutation:
    return Mutation(name, path, before, after, tests)


ENGINE = "jevany_daemon/engine/"
CLIENT = "client/jevany_client/"
MUTATIONS = [
    # --- the answer self-check ----------------------------------------------------------
    m("self-check: a sum below 1 passes", CLIENT + "answers.py",
      "    if total <= 0 or abs(total - 1) > tolerance:",
      "    if total <= 0 or total - 1 > tolerance:", "tests/client/test_answers.py",
      "tests/client/test_self_check_sums.py"),
    # --- batching: which requests share a pass ------------------------------------------
    m("batching: a shared prefix counted once per pass", ENGINE + "batching.py",
      "    return rows + len(batch) * max(p.prefix for p in batch)",
      "    return rows + max(p.prefix for p in batch)", "tests/engine/test_batching.py"),
    # --- the adaptive policy ------------------------------------------------------------
    m("policy: the newest pass weighs four fifths", ENGINE + "policy.py",
      "        self.rates[key] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate",
      "        self.rates[key] = rate if old is None else SMOOTHING * old + (1 - SMOOTHING) * rate",
      "tests/engine/test_policy.py"),
    # --- prefix reuse -------------------------------------------------------------------
    m("prefix reuse: a hit costed as if its state ran again", ENGINE + "prefix_reuse.py",
      "        return len(enc.stem) - self.memory.peek(enc.stem) + sum(map(len, self._tails(enc)))",
      "        return len(enc.stem) + sum(map(len, self._tails(enc)))", "tests/engine/test_reuse_costs.py"),
    m("prefix reuse: new stems on the pinned head left out of the one-pass rule", ENGINE + "prefix_reuse.py",
      "            fresh = [s for s in todo if not s.cached or s.base in pinned]",
      "            fresh = [s for s in todo if not s.cached]", "tests/engine/test_reuse_costs.py"),
]


def run(mutation: Mutation, timeout: float) -> tuple[str, float]:
    """('killed' | 'survived' | 'timeout', seconds) for one mutation, its file restored afterwards."""
    path = ROOT / mutation.path
    original = path.read_text()
    if original.count(mutation.before) != 1:
        raise SystemExit(f"{mutation.name}: the line to mutate occurs {original.count(mutation.before)} times in "
                         f"{mutation.path}, not once; update scripts/mutate.py")
    started = time.monotonic()
    try:
        path.write_text(original.replace(mutation.before, mutation.after))
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                               *mutation.tests], cwd=ROOT, capture_output=True, timeout=timeout)
        outcome = "survived" if proc.returncode == 0 else "killed"
    except subprocess.TimeoutExpired:
        outcome = "timeout"
    finally:
        path.write_text(original)
    return outcome, time.monotonic() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="WORD", help="mutations whose name contains one of these")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a mutation's tests may take")
    parser.add_argument("--require", type=float, default=0.95, help="score below which the exit status is 1")
    args = parser.parse_args(argv)
    chosen = [mu for mu in MUTATIONS if not args.only or any(w in mu.name for w in args.only)]
    if args.list:
        for mu in chosen:
            print(f"{mu.name}  [{mu.path}; {' '.join(mu.tests)}]")
        return 0
    outcomes = []
    for mu in chosen:
        outcome, seconds = run(mu, args.timeout)
        outcomes.append((mu, outcome))
        print(f"{outcome:8} {seconds:6.1f} s  {mu.name}", flush=True)
    killed = sum(o != "survived" for _, o in outcomes)
    score = killed / len(outcomes) if outcomes else 1.0
    print(f"\nscore: {killed}/{len(outcomes)} killed ({score:.0%})")
    for mu, o in outcomes:
        if o == "survived":
            print(f"  survived: {mu.name} ({mu.path})")
        elif o == "timeout":
            print(f"  timed out (counted killed): {mu.name}")
    return 0 if score >= args.require else 1


if __name__ == "__main__":
    sys.exit(main())
