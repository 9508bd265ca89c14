"""mutmut over pure-Python client modules: every mutant its operators make, not a hand-kept list.

    make mutmut                                   # the default modules below
    python scripts/mutmut_client.py --modules eval/shards.py --tests tests/client/test_eval_shards.py

Where it fits: client modules whose tests call them in process (no daemon, no
subprocess). mutmut learns which tests reach a function by running them in its
own process, so code a test reaches through a daemon or a child process looks
untested to it; and it imports the mutated package from the root of the tree
it copies, while ours lives under client/. So this copies client/jevany_client
and tests/ (the root conftest and tests/client) into a scratch directory laid
out as mutmut expects, runs `mutmut run` there, and prints `mutmut results`:
the survivors, by name; `--show` prints each survivor's diff. The daemon's
modules stay with scripts/mutate.py, whose list names the tests that drive
them through real processes.

Reading the survivors: most are changes to a message's text (an error's
wording, its case), which no test should pin; the rest are read as
scripts/mutate.py's are (tests/README.md, "The mutation check").
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("eval/shards.py", "eval/merge.py", "eval/results.py")
TESTS = ("tests/client/test_eval_shards.py", "tests/client/test_eval_files.py")


def scratch_tree(where: Path, modules, tests) -> None:
    """The package at the root and the tests beside it, with mutmut's settings in setup.cfg."""
    shutil.copytree(ROOT / "client" / "jevany_client", where / "jevany_client",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (where / "tests" / "client").mkdir(parents=True)
    for name in ("__init__.py", "conftest.py"):
        shutil.copy2(ROOT / "tests" / name, where / "tests" / name)
    shutil.copytree(ROOT / "tests" / "client", where / "tests" / "client", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    lines = ["[mutmut]", "source_paths =", *(f"    jevany_client/{m}" for m in modules),
             # The whole package beside the mutated modules, so what they import is there.
             "also_copy =", "    jevany_client",
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests),
             "pytest_add_cli_args =", "    -p", "    no:cacheprovider"]
    (where / "setup.cfg").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", default=MODULES, metavar="PATH",
                        help="modules under client/jevany_client/ to mutate")
    parser.add_argument("--tests", nargs="+", default=TESTS, metavar="PATH", help="the tests that cover them")
    parser.add_argument("--show", action="store_true", help="print each survivor's diff")
    args = parser.parse_args(argv)
    try:
        import mutmut  # noqa: F401 - only to say how to get it
    except ImportError:
        raise SystemExit("mutmut is not installed here: `make mutmut` installs it (or pip install mutmut)")
    with tempfile.TemporaryDirectory(prefix="jevany-mutmut-") as scratch:
        where = Path(scratch)
        scratch_tree(where, args.modules, args.tests)
        mutmut = [sys.executable, "-m", "mutmut"]
        ran = subprocess.run([*mutmut, "run"], cwd=where)
        results = subprocess.run([*mutmut, "results"], cwd=where, capture_output=True, text=True).stdout
        survivors = [line.strip() for line in results.splitlines() if line.strip()]
        for line in survivors:
            name = line.split(":")[0]
            print(subprocess.run([*mutmut, "show", name], cwd=where, capture_output=True, text=True).stdout
                  if args.show else line)
        print(f"\n{len(survivors)} not killed (survived, or not reached by the tests)")
        return ran.returncode


if __name__ == "__main__":
    sys.exit(main())
