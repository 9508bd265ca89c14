"""The worker process: load the model once, then score whatever the supervisor hands over.

Run by the supervisor as ``python -m jevany_daemon.worker``. It is the
only process that imports torch. It asks for nothing: the supervisor sends it
what is waiting (group commit across the process boundary) when it is free,
or, while a pass runs, a full pass's worth; its loop (loop.py) keeps
a pass on the device while the host admits, forms and answers around it.
"""
import argparse
import gc
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import zmq

from jevany_client.ipc_trust import ipc_problem

from jevany_daemon import channel
from jevany_daemon.config import EngineConfig, LoadOptions
from jevany_daemon.engine.shape_plan import PlanTooLarge
from jevany_daemon.inherited_settings import read_settings
from jevany_daemon.logs import configure_logging, event

from .collector import CollectorWatch
from .loop import WorkerLoop

log = logging.getLogger("jevany.worker")

DEMO_ARCH, DEMO_READOUT = "qwen3", "choice"


def cache_dir() -> Path:
    """Where a worker keeps what it builds once: JEVANY_CACHE_DIR, else the user's cache directory."""
    return Path(os.environ.get("JEVANY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jevany"))


class UnsafeDirectory(ValueError):
    """A directory the worker would load code from, which another user could write to."""


def configure_compile_cache() -> Path:
    """Where torch.compile keeps the kernels it builds, so a restart compiles nothing again:
    TORCHINDUCTOR_CACHE_DIR if set, else cache_dir()/inductor (inductor's own default is under the
    shared /tmp). What is kept there is code the worker loads and runs, so the directory, and every one
    above it, must be writable by nobody else, and it must be the worker's own (ipc_trust's checks).
    """
    path = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or cache_dir() / "inductor").expanduser().absolute()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = ipc_problem(path / "kernel")
    if problem is None and (owner := path.stat().st_uid) != os.getuid():
        problem = f"{path} belongs to uid {owner}, not to this worker's uid {os.getuid()}"
    if problem is not None:
        raise UnsafeDirectory(f"cannot keep compiled kernels in {path}: {problem}; set TORCHINDUCTOR_CACHE_DIR "
                              "(or JEVANY_CACHE_DIR) to a directory of this user's own")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


def demo_model_dir() -> Path:
    """The built-in demo model, built once into the user's cache directory."""
    target = cache_dir() / f"tiny-{DEMO_ARCH}-{DEMO_READOUT}"
    if not (target / "config.json").is_file():
        from jevany_daemon.model.tiny import build_tiny_model

        target.parent.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename, so a crash or a second worker
        # never sees a half-written model.
        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
        build_tiny_model(staging / "model", arch=DEMO_ARCH, readout=DEMO_READOUT)
        try:
            os.rename(staging / "model", target)
        except OSError:
            pass   # another worker finished first; its copy is identical
    return target


def load_engine(settings: dict, observer=None):
    from transformers.utils import logging as hf_logging

    from jevany_daemon.engine.engine import Engine
    from jevany_daemon.engine.warmup import warm_up
    from jevany_daemon.model.loading import load_model

    hf_logging.disable_progress_bar()   # progress bars are noise in a service log

    if settings.get("cpu_threads"):
        import torch

        torch.set_num_threads(settings["cpu_threads"])
    source = settings["model"]
    if source is None:
        source = str(demo_model_dir())
        event(log, "demo_model", path=source,
              note="no --model given: serving a tiny model with RANDOM weights; its answers mean nothing")
    model = load_model(source, readout=settings["readout"], device=settings["device"],
                       dtype=settings["dtype"], model_id=settings["model_id"],
                       temperature=settings.get("temperature"),
                       device_map=settings.get("device_map"), max_memory_gib=settings.get("max_memory_gib"),
                       media=settings.get("media_root") is not None, options=LoadOptions(**settings["load"]))
    if settings["model"] is None:
        model.info["random_weights"] = True      # status and jevany-ctl say so, not only this log
    if model.info.get("linear_attention"):
        event(log, "linear_attention", path=model.info["linear_attention"], dtype=settings["dtype"])
    simulated = settings.get("simulate_accelerator")
    if simulated:
        from jevany_daemon.model.free_attention import make_attention_free

        make_attention_free(model)
        event(log, "simulated_accelerator", pass_ms=simulated, note="benchmark mode: answers are meaningless")
    engine = Engine(model, EngineConfig(**settings["engine"]), observer=observer, simulated_pass_ms=simulated)
    started = time.monotonic()
    paths = warm_up(engine)
    event(log, "warm_up", device=str(model.device), paths=",".join(paths),
          seconds=round(time.monotonic() - started, 3))
    if engine.config.runner is not None:
        if engine.config.runner == "compiled":
            event(log, "compile_cache", path=str(configure_compile_cache()))
        event(log, "shape_plan_warm_up", runner=engine.config.runner, note="every shape runs before ready")
        phases = engine.warm_plan()
        plan = engine.replay.describe()
        event(log, "shape_plan", runner=plan["runner"], buckets=plan["buckets"], rows=_listed(plan["rows"]),
              widths=_listed(plan["widths"]), max_tokens=plan["max_tokens"], cached=plan["cached"],
              captured=plan["captured"], **{f"{phase}_s": s for phase, s in phases.items()})
    return engine


def _listed(values: list[int]) -> str:
    return ",".join(map(str, values))


def settle_heap() -> None:
    """Put what the worker loaded out of the garbage collector's sight, for good.

    The model's modules and parameters, the tokenizer and what warm-up built
    live as long as the process: some 370,000 objects that a full collection
    would walk every time, once every hundred passes or so, while the device
    waits. On the tiny Qwen3 such a collection took 360 ms; frozen, and with
    remembered prompt pieces kept as tuples (piecewise.py), about a
    millisecond at most (benchmarks/host_bench.py measures both).
    """
    gc.collect()
    gc.freeze()


class Heartbeat(threading.Thread):
    """Tells the supervisor every interval that this process lives, while the main thread scores.

    A thread rather than beats between batches, so a long batch is not taken
    for a hang; a batch that truly hangs is the supervisor's batch deadline.
    """

    def __init__(self, ctx, backend: str, identity: bytes, interval_s: float):
        super().__init__(name="heartbeat", daemon=True)
        self.ctx, self.backend, self.identity, self.interval_s = ctx, backend, identity, interval_s
        self.stopped = threading.Event()

    def run(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)    # its own socket: ZeroMQ sockets are not shared between threads
        sock.setsockopt(zmq.IDENTITY, self.identity + channel.HEARTBEAT_SUFFIX)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.backend)
        beat = channel.encode(channel.HEARTBEAT)
        try:
            while not self.stopped.wait(self.interval_s):
                try:
                    sock.send(beat, zmq.NOBLOCK)
                except zmq.Again:
                    pass    # the supervisor is not reading; silence is the message
        finally:
            sock.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="jevany-daemon worker (started by the supervisor)")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--settings", default=None, help="ServeSettings as JSON")
    parser.add_argument("--settings-fd", type=int, default=None,
                        help="a descriptor to read them from instead (the supervisor's way: inherited_settings.py)")
    parser.add_argument("--parent", type=int, default=None,
                        help="the supervisor's pid: given, since it may die while this process loads the model")
    args = parser.parse_args(argv)
    parent = os.getppid() if args.parent is None else args.parent
    # The supervisor decides when workers stop (after draining); a Ctrl-C sent
    # to the whole process group must not kill requests in flight.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if (args.settings is None) == (args.settings_fd is None):
        parser.error("give one of --settings and --settings-fd")
    settings = read_settings(args.settings, args.settings_fd)
    configure_logging()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, args.identity.encode())
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(args.backend)
    batches: list = []    # the engine's BatchRecords since the last results message
    started = time.monotonic()
    try:
        engine = load_engine(settings, observer=batches.append)
    except (PlanTooLarge, UnsafeDirectory) as exc:    # a settings error: the supervisor stops with exit 2
        event(log, "worker_load_failed", level=logging.ERROR, error=str(exc))
        sock.send(channel.encode(channel.FAILED, str(exc)))
        sock.close()
        ctx.term()
        return channel.EXIT_SETTINGS
    except Exception as exc:   # noqa: BLE001 - reported to the supervisor, which stops
        message = f"{type(exc).__name__}: {exc}"
        event(log, "worker_load_failed", level=logging.ERROR, error=message)
        sock.send(channel.encode(channel.FAILED, message))
        sock.close()
        ctx.term()
        return channel.EXIT_LOAD_FAILED
    batches.clear()    # the warm-up's passes are not traffic
    settle_heap()
    heartbeat = Heartbeat(ctx, args.backend, args.identity.encode(),
                          channel.heartbeat_interval(settings["heartbeat_timeout"]))
    heartbeat.start()
    sock.send(channel.encode(channel.HELLO, {"pid": os.getpid(), "model": engine.describe(),
                                             "load_s": round(time.monotonic() - started, 3),
                                             "device_info": engine.device_info(),
                                             "overlaps": engine.asynchronous}))
    collector = CollectorWatch()      # from here: the warm-up's collections are not traffic's
    try:
        return WorkerLoop(sock, engine, batches, parent, collector).run()
    finally:
        collector.close()
        heartbeat.stopped.set()
        heartbeat.join()
        sock.close()
        ctx.term()


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown: unloading torch and its threads takes seconds,
    and a worker has nothing left to save once its sockets are closed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
