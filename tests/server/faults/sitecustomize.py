"""Device faults injected into real worker processes, for tests/server/test_device_faults.py.

That test puts this directory on the daemon's PYTHONPATH and names a trigger
directory in JEVANY_TEST_FAULT_DIR. In worker processes only (the supervisor
must never import torch), attention then checks the directory on every call:
a trigger file present is removed and its fault raised, so each trigger fires
exactly once, in whichever worker gets there first. A trigger's content, if
any, is the least batch size it fires on.

Two more triggers act when a worker process starts, before it loads the
model, and stay until the test removes them, so they hold for every worker
started meanwhile: "exit_before_load" makes the worker exit 1 at once (a
replacement or a reload's worker that dies before loading), "hold_before_load"
makes it wait there until the file is gone (a reload kept in progress).
"""
import os
import sys

_DIR = os.environ.get("JEVANY_TEST_FAULT_DIR")

if _DIR and sys.orig_argv[1:3] == ["-m", "jevany_daemon.worker"]:
    import time

    if os.path.exists(os.path.join(_DIR, "exit_before_load")):
        os._exit(1)
    while os.path.exists(os.path.join(_DIR, "hold_before_load")):
        time.sleep(0.05)    # a worker held on purpose; the test removes the file to let it load

    import torch
    import torch.nn.functional as F

    _FAULTS = {
        # What CUDA raises after a kernel fault: the context is unusable from then on.
        "poison": lambda: torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        "oom": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        # Neither a device loss nor out-of-memory: a failure that belongs to the request alone.
        "fail": lambda: RuntimeError("injected scoring failure"),
    }
    _real = F.scaled_dot_product_attention

    def _fire(batch: int) -> None:
        for name, make in _FAULTS.items():
            path = os.path.join(_DIR, name)
            try:
                with open(path) as f:
                    least = int(f.read().strip() or 1)
                if batch < least:
                    continue
                os.unlink(path)
            except (FileNotFoundError, ValueError):
                continue
            raise make()

    def _sdpa(query, *args, **kwargs):
        _fire(query.shape[0])
        return _real(query, *args, **kwargs)

    F.scaled_dot_product_attention = _sdpa
