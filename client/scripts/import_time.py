"""How long the client's imports take, each in a fresh interpreter.

    python client/scripts/import_time.py [--runs N]

Prints, per statement, the best wall time over N runs and the cumulative
figure `python -X importtime` gives the top module, and fails if the model
stack (torch, transformers) was imported.
"""

import argparse
import subprocess
import sys

STATEMENTS = {
    "import jevany_client": "jevany_client",
    "from jevany_client import JevClient": "jevany_client.client",
    "from jevany_client import AsyncJevClient": "jevany_client.async_client",
    "import jevany_client.cli": "jevany_client.cli",
}
HEAVY = ("torch", "transformers")

_PROBE = """
import sys, time
start = time.perf_counter()
{statement}
elapsed = time.perf_counter() - start
print(elapsed, ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def measure(statement: str) -> tuple[float, str]:
    code = _PROBE.format(statement=statement, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seconds, _, heavy = out.stdout.strip().partition(" ")
    return float(seconds), heavy


def importtime_us(statement: str, module: str) -> int:
    """The cumulative microseconds -X importtime reports for `module`."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        check=True,
    )
    for line in out.stderr.splitlines():
        fields = [field.strip() for field in line.removeprefix("import time:").split("|")]
        if len(fields) == 3 and fields[2].strip() == module:
            return int(fields[1])
    return -1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    failed = False
    for statement, module in STATEMENTS.items():
        timings = [measure(statement) for _ in range(runs)]
        best = min(seconds for seconds, _ in timings)
        heavy = {name for _, names in timings for name in names.split(",") if name}
        cumulative = min(importtime_us(statement, module) for _ in range(runs))
        note = f"  IMPORTED {sorted(heavy)}" if heavy else ""
        print(
            f"{statement:38s} {best * 1000:6.1f} ms wall   "
            f"{cumulative / 1000:6.1f} ms importtime of {module}{note}"
        )
        failed |= bool(heavy)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
