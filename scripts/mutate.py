"""The mutation check: plant plausible one-line bugs, one at a time, and see whether the tests catch them.

    make mutate                              # every mutation in mutations.py
    python scripts/mutate.py --only gather tenants --list
    python scripts/mutate.py --only retries --timeout 120
    python scripts/mutate.py --mutations held_out.py   # another list, e.g. a reviewer's held-out bugs

Each mutation names a file, a line of it as it is and as the bug would write
it, and the tests that cover that module (as few as catch its slips). The
line must occur exactly once (else the list has rotted, and the check says so
before anything runs). First each distinct test selection runs unmutated and
must pass, else every mutation of it would look killed. Then, one mutation at
a time, the file is written in place (its cached bytecode removed, so the
mutant is what runs), the tests run in a child pytest (-x, stop at the first
failure) with this checkout first on PYTHONPATH (daemons the tests start
inherit it), and the file is put back whatever happens, also on Ctrl-C. The
child runs in its own process group, ended afterwards, so a daemon a failing
or hung test left behind goes with it. A mutation is killed when its tests
fail, survives when they pass; a run past --timeout counts as killed (the bug
made something hang) and is reported apart. Prints each outcome, the score
(killed / total) and the survivors; exit status 0 when the score reaches
--require (default 0.95), else 1.

Not part of `make test`: it runs the covering tests once per mutation, one
child at a time (the list, in mutations.py, says how many it holds). On two
cores mutations.py's own entries, most of them driving daemons, took about
35 minutes; most entries of the area files beside it run unit tests in a
few seconds. --only runs the few a change touches.
"""
import argparse
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from mutations import MUTATIONS, ROOT, Mutation     # beside this script: the list it plants


def pytest_env() -> dict:
    """The children import this checkout's code, whatever copy the interpreter has installed."""
    paths = [str(ROOT), str(ROOT / "client"), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def run_tests(tests: tuple[str, ...], timeout: float) -> str:
    """'passed', 'failed' or 'timeout' for one child pytest (-x), its process group ended after."""
    # Its own session, so what the tests started (daemons, fake daemons) goes with it on a timeout.
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                            cwd=ROOT, env=pytest_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # a hung test, or a daemon a failed test left behind
        except ProcessLookupError:
            pass
        proc.wait()
    if code in (4, 5):
        raise SystemExit(f"pytest {' '.join(tests)}: exit {code} (a usage error, or no tests collected): "
                         "update its list (scripts/mutations.py, or the --mutations file)")
    return "timeout" if code is None else "passed" if code == 0 else "failed"


def forget_bytecode(path: Path) -> None:
    # A mutant of the same size written within the second of its original would otherwise be run
    # from the original's cached bytecode (and the original, restored, from the mutant's).
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink(missing_ok=True)


def problems(mutation: Mutation) -> list[str]:
    """What makes an entry stale: its line not found exactly once, a no-op mutant, a test file or test gone.

    Cheap (a text search per entry): tests/test_mutations_list.py runs it on every entry in `make test`.
    """
    found = []
    path = ROOT / mutation.path
    if not path.is_file():
        found.append(f"{mutation.path} does not exist")
    else:
        count = path.read_text().count(mutation.before)
        if count != 1:
            found.append(f"the line to mutate occurs {count} times in {mutation.path}, not once")
    if mutation.after == mutation.before:
        found.append("the mutated line is the original")
    for test in mutation.tests:
        file, _, name = test.partition("::")
        if not (ROOT / file).is_file():
            found.append(f"no test file {file}")
        elif name and not re.search(rf"^(async )?def {re.escape(name)}\(", (ROOT / file).read_text(), re.M):
            found.append(f"no test {name} in {file}")
    return found


def check_all(mutations) -> None:
    """Every stale entry named at once (not only the first), before anything runs."""
    stale = [f"  {mu.name}: {'; '.join(found)}" for mu in mutations if (found := problems(mu))]
    if stale:
        raise SystemExit(f"{len(stale)} stale mutation(s); update the list (scripts/mutations.py, "
                         "or the --mutations file):\n" + "\n".join(stale))


def check(mutation: Mutation) -> str:
    """The file's text, checked again just before it is mutated (a run is long; the tree may change)."""
    if found := problems(mutation):
        raise SystemExit(f"{mutation.name}: {'; '.join(found)}; update its list "
                         "(scripts/mutations.py, or the --mutations file)")
    return (ROOT / mutation.path).read_text()


def run(mutation: Mutation, timeout: float) -> tuple[str, float]:
    """('killed' | 'survived' | 'timeout', seconds) for one mutation, its file restored afterwards."""
    path = ROOT / mutation.path
    original = check(mutation)
    started = time.monotonic()
    try:
        path.write_text(original.replace(mutation.before, mutation.after))
        forget_bytecode(path)
        outcome = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[run_tests(mutation.tests, timeout)]
    finally:
        path.write_text(original)
        forget_bytecode(path)
    return outcome, time.monotonic() - started


def load_list(path: str) -> list[Mutation]:
    """MUTATIONS from another list file, written like mutations.py (it may import m from mutations)."""
    spec = importlib.util.spec_from_file_location("other_mutations", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.MUTATIONS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="WORD", help="mutations whose name contains one of these")
    parser.add_argument("--list", action="store_true", help="list the mutations (each line checked) and exit")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a mutation's tests may take")
    parser.add_argument("--require", type=float, default=0.95, help="score below which the exit status is 1")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip running each test selection unmutated first")
    parser.add_argument("--mutations", metavar="FILE",
                        help="plant this file's MUTATIONS instead of mutations.py's (a held-out list)")
    args = parser.parse_args(argv)
    listed = load_list(args.mutations) if args.mutations else MUTATIONS
    chosen = [mu for mu in listed if not args.only or any(w in mu.name for w in args.only)]
    check_all(chosen)
    if args.list:
        for mu in chosen:
            print(f"{mu.name}  [{mu.path}; {' '.join(mu.tests)}]")
        return 0
    if not args.no_baseline:
        # A selection that fails unmutated would count every mutation of it as killed.
        for tests in dict.fromkeys(mu.tests for mu in chosen):
            started = time.monotonic()
            outcome = run_tests(tests, args.timeout)
            print(f"baseline {time.monotonic() - started:6.1f} s  {outcome}: {' '.join(tests)}", flush=True)
            if outcome != "passed":
                raise SystemExit(f"the tests {' '.join(tests)} do not pass unmutated; fix them first")
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
