"""Shared fixtures: tiny models built once per session.

torch is imported lazily so client tests stay torch-free.
"""
import os
import threading
import traceback
import warnings

import pytest
import zmq

# No test may reach the network; set before transformers / huggingface_hub are imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# pyzmq terms a context the collector finds unclosed. When its sockets are garbage in the same
# reference cycle (an object holding both, never closed), the collector has already cleared the weak
# references the context keeps to them, so it cannot close them and term() waits until they are
# finalized, later in the same collection: on this thread, that is for ever, and whichever test the
# collection fell in hangs the run. So the sockets it still knows are closed here, term() waits on a
# thread of its own, and the leak becomes a ResourceWarning naming where the context was made.
_context_init = zmq.Context.__init__


def _recorded_init(self, *args, **kwargs):
    _context_init(self, *args, **kwargs)
    object.__setattr__(self, "_made_at", "".join(traceback.format_stack(limit=8)[:-1]))


def _collected(self):
    if self._shadow or self.closed:
        return
    warnings.warn(f"a zmq context left unclosed, made at:\n{getattr(self, '_made_at', '?')}", ResourceWarning)
    for sock in list(getattr(self, "_sockets", None) or []):
        if not sock.closed:
            sock.close(linger=0)
    threading.Thread(target=self.term, name="zmq-term", daemon=True).start()


zmq.Context.__init__, zmq.Context.__del__ = _recorded_init, _collected

# Under pytest-xdist the workers share the cores: each takes its share, not all of them.
TEST_THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


# Under xdist (--dist loadfile) a file runs whole on one worker, files handed out in the order
# collected (`make test` turns off xdist's own order, by number of tests, which left the longest
# files, with few tests each, to the end: one worker alone on them while the other idled). The
# files that take longest go first, longest first; the rest keep pytest's order. Seconds are one
# full run's (--durations, summed per file, 2 cores, a slow machine), to be remeasured as files grow.
SLOW_FIRST = (
    "tests/test_readme.py",                      # 136: every docs example, 8 daemons
    "tests/server/test_lifecycle.py",            # 88
    "tests/server/test_http.py",                 # 85
    "tests/benchmarks/test_gpu_check.py",        # 121; 87 once its run was cut
    "tests/server/test_media_requests.py",       # 78
    "tests/engine/test_parity.py",               # 70: trains the starter model others share
    "tests/reliability/test_soak.py",            # 76, mostly waiting: 60 s of moderate load
    "tests/benchmarks/test_soak_bench.py",       # about 35: 20 s of the production mix
    "tests/server/test_error_codes.py",          # 70
    "tests/server/test_reload.py",               # 64
    "tests/benchmarks/test_bench_parity.py",     # 108; 66 once its run was cut
    "tests/server/test_supervision.py",          # 45
    "tests/server/test_device_faults.py",        # 39
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "soak: a soak's short form, the 60-second one (tests/reliability; the full run is scripts/soak.py) "
                   "and the production mix's 20 s (tests/benchmarks; benchmarks/soak_bench.py); -m 'not soak' "
                   "leaves them out")


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))     # stable


def _set_threads():
    import torch

    if torch.get_num_threads() != TEST_THREADS:
        torch.set_num_threads(TEST_THREADS)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(arch="qwen3", readout="choice", seed=0) -> directory, built once per session."""
    cache = {}

    def build(arch="qwen3", readout="choice", seed=0):
        key = (arch, readout, seed)
        if key not in cache:
            from jevany_daemon.model.tiny import build_tiny_model

            _set_threads()
            out = tmp_path_factory.mktemp(f"tiny-{arch}-{readout}-{seed}")
            cache[key] = build_tiny_model(out, arch=arch, readout=readout, seed=seed)
        return cache[key]

    return build


@pytest.fixture(scope="session")
def loaded_model(tiny_model):
    """loaded_model(arch="qwen3", readout="choice") -> DecisionModel (fp32, cpu), shared by the session.

    Shared: tests must not modify the model they get.
    """
    cache = {}

    def load(arch="qwen3", readout="choice"):
        key = (arch, readout)
        if key not in cache:
            from jevany_daemon.model.loading import load_model

            _set_threads()
            cache[key] = load_model(str(tiny_model(arch, readout)), device="cpu", dtype="fp32")
        return cache[key]

    return load


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory):
    """The starter model (`jevany-daemon tiny-model --trained`), trained once per session: its run directory.

    Trained with the shipped recipe, so the tests check what users get. Shared: do not modify it.
    """
    from filelock import FileLock

    from jevany_daemon.starter.build import build_trained_model

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent       # the run's own temp dir, shared by its xdist workers: train once per run
    out = root / "starter-run"
    with FileLock(str(root / "starter-run.lock")):
        if not out.exists():     # the build renames its finished directory into place
            _set_threads()
            build_trained_model(out)
    return out
