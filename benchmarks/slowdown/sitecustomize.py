"""A slower daemon for benchmarks/fleet_bench.py: each pass through the model's backbone waits,
after it ran, JEVANY_BENCH_SLOWDOWN times as long as it took (1.0: about half speed).

fleet_bench.py puts this directory on one daemon's PYTHONPATH. It acts in worker processes
only (the supervisor must never import torch). A wait, not a busy loop: the daemon is slower
without taking the CPU from the others on the same machine.
"""
import os
import sys

_FACTOR = float(os.environ.get("JEVANY_BENCH_SLOWDOWN", "0") or 0)

if _FACTOR > 0 and sys.orig_argv[1:3] == ["-m", "jevany_daemon.worker"]:
    import functools
    import time

    from jevany_daemon.engine.decoder import Decoder

    # The backbone's forward: the one step every layout and the worker's pipeline share.
    _real = Decoder.__call__

    @functools.wraps(_real)
    def _slow_backbone(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return _real(self, *args, **kwargs)
        finally:
            time.sleep((time.perf_counter() - started) * _FACTOR)

    Decoder.__call__ = _slow_backbone
