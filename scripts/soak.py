"""Soak the daemon: moderate load for a long time, RSS and file descriptors sampled every minute.

    .venv/bin/python scripts/soak.py --duration-s 1800 --warmup-s 300 --sample-s 60 --out soak.json

Starts a daemon on the tiny model, runs the load, prints every sample and the
verdict (RSS growth after warm-up <= 5%, no fd growth, every request answered
as expected, the worker never replaced); exit 1 on any problem. The logic
lives in tests/reliability/soak.py, whose 60-second form runs in `make test`.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # the repository root, for tests.reliability

from tests.reliability.soak import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
