"""Device faults injected into real worker processes, for tests/server/test_device_faults.py.

That test puts this directory on the daemon's PYTHONPATH and names a trigger
directory in JEVANY_TEST_FAULT_DIR. In worker processes only (the supervisor
must never import torch), attention then checks the directory on every call:
a trigger file present is removed and its fault raised, so each trigger fires
exactly once, in whichever worker gets there first. A trigger's content, if
any, is the least batch size it fires on.
"""
import os
import sys

_DIR = os.environ.get("JEVANY_TEST_FAULT_DIR")

if _DIR and sys.orig_argv[1:3] == ["-m", "jevany_daemon.server.worker"]:
    import torch
    import torch.nn.functional as F

    _FAULTS = {
        # What CUDA raises after a kernel fault: the context is unusable from then on.
        "poison": lambda: torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        "oom": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
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
