"""The worker process: load the model once, then score whatever the supervisor hands over.

Run by the supervisor as ``python -m jevany_daemon.server.worker``. It is the
only process that imports torch. It asks for nothing and keeps no queue: the
supervisor sends it everything waiting (group commit across the process
boundary) as soon as it reports ready.
"""
import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import zmq

from jevany_client.errors import InternalError, JevanyError
from jevany_client.protocol import decode_request

from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.faults import DeviceLost
from jevany_daemon.media.files import PrivateCopies, read_verified

from . import channel
from .logs import configure_logging, event

log = logging.getLogger("jevany.worker")

PARENT_CHECK_MS = 1000
DEMO_ARCH, DEMO_READOUT = "qwen3", "choice"


def demo_model_dir() -> Path:
    """The built-in demo model, built once into the user's cache directory."""
    cache = os.environ.get("JEVANY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jevany"
    )
    target = Path(cache) / f"tiny-{DEMO_ARCH}-{DEMO_READOUT}"
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
                       media=settings.get("media_root") is not None)
    if settings["model"] is None:
        model.info["random_weights"] = True      # status and jevany-ctl say so, not only this log
    if model.info.get("linear_attention"):
        event(log, "linear_attention", path=model.info["linear_attention"], dtype=settings["dtype"])
    engine = Engine(model, EngineConfig(**settings["engine"]), observer=observer)
    started = time.monotonic()
    paths = warm_up(engine)
    event(log, "warm_up", device=str(model.device), paths=",".join(paths),
          seconds=round(time.monotonic() - started, 3))
    return engine


def score(engine, items: list, early=None) -> list:
    """[[tag, request message]...] → [[tag, ok, result or error]...]; one bad request never fails the others.

    The supervisor already accepted each message; decoding it again here, with
    the same strict decoder, is what keeps queued requests at their wire size.
    A hand-over the engine splits into several passes reports each pass but
    the last to early([[tag, ok, result or error]...]) as it ends; the return
    value holds everything not reported that way.
    """
    outcomes, admitted, tags = {}, [], []
    copies = PrivateCopies()      # checked media, decoded from here rather than from their paths
    for tag, payload, *extra in items:
        origin, media, tenant = (extra + [None, None, None])[:3]
        try:
            body = decode_request(payload).body
            if media:     # the files as the media checker checked them: those bytes, or a refusal
                body = {**body, "media": [{"type": kind, "uri": copies.add(read_verified(path, checked))}
                                          for kind, path, checked in media]}
            admitted.append(engine.admit(body, origin, tenant=tenant))
            tags.append(tag)
        except JevanyError as exc:
            outcomes[tag] = exc
        except Exception as exc:   # noqa: BLE001 - becomes this request's internal error
            outcomes[tag] = InternalError(f"admission failed: {type(exc).__name__}: {exc}")
    reported = set()

    def pass_done(done: list) -> None:
        reported.update(tags[i] for i, _ in done)
        early([_wire(tags[i], o) for i, o in done])

    try:
        for tag, outcome in zip(tags, engine.score(admitted, early=pass_done if early else None)):
            outcomes[tag] = outcome
    finally:
        copies.close()
    return [_wire(item[0], outcomes[item[0]]) for item in items if item[0] not in reported]


def _wire(tag, outcome) -> list:
    if isinstance(outcome, JevanyError):
        return [tag, False, outcome.to_wire()]
    return [tag, True, outcome]


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


def serve(sock, engine, batches: list, parent: int) -> int:
    """Score hand-overs until told to stop, or until the supervisor (pid parent) is gone; the exit code."""
    while True:
        if not sock.poll(PARENT_CHECK_MS):
            if os.getppid() != parent:
                event(log, "worker_exit", cause="supervisor gone")
                return 0
            continue
        kind, *args = channel.decode(sock.recv())
        if kind == channel.STOP:
            return 0
        if kind == channel.CLEAR:
            sock.send(channel.encode(channel.CLEARED, engine.clear_prefix_cache(), engine.prefix_cache_stats()))
        if kind == channel.BATCH:
            early = partial(send_answers, sock, engine, batches, channel.EARLY)
            try:
                answers = score(engine, args[0], early=early)
            except DeviceLost as exc:
                # The CUDA context is unusable: exit, so the supervisor answers what this
                # worker held with worker_lost and starts a fresh process on a fresh context.
                event(log, "worker_device_lost", level=logging.ERROR, error=str(exc))
                return channel.EXIT_DEVICE_LOST
            send_answers(sock, engine, batches, channel.RESULTS, answers)


def send_answers(sock, engine, batches: list, kind: str, answers: list) -> None:
    """EARLY or RESULTS, with the statistics and the passes run since the last message."""
    records = [[r.size, r.padded_tokens, r.real_tokens, r.latency_ms, r.ok, list(r.origins)] for r in batches]
    batches.clear()
    stats = engine.stats.as_dict() | {"device_info": device_info(engine),
                                      "prefix_cache": engine.prefix_cache_stats()}
    sock.send(channel.encode(kind, answers, stats, records))


def device_info(engine) -> dict:
    from jevany_daemon.model.devices import devices_report    # torch: imported once the model is

    return devices_report(engine.model.devices)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="jevany-daemon worker (started by the supervisor)")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--settings", required=True, help="ServeSettings as JSON")
    parser.add_argument("--parent", type=int, default=None,
                        help="the supervisor's pid: given, since it may die while this process loads the model")
    args = parser.parse_args(argv)
    parent = os.getppid() if args.parent is None else args.parent
    # The supervisor decides when workers stop (after draining); a Ctrl-C sent
    # to the whole process group must not kill requests in flight.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    settings = json.loads(args.settings)
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
    except Exception as exc:   # noqa: BLE001 - reported to the supervisor, which stops
        message = f"{type(exc).__name__}: {exc}"
        event(log, "worker_load_failed", level=logging.ERROR, error=message)
        sock.send(channel.encode(channel.FAILED, message))
        sock.close()
        ctx.term()
        return channel.EXIT_LOAD_FAILED
    batches.clear()    # the warm-up's passes are not traffic
    heartbeat = Heartbeat(ctx, args.backend, args.identity.encode(),
                          channel.heartbeat_interval(settings["heartbeat_timeout"]))
    heartbeat.start()
    sock.send(channel.encode(channel.HELLO, {"pid": os.getpid(), "model": engine.describe(),
                                             "load_s": round(time.monotonic() - started, 3),
                                             "device_info": device_info(engine)}))
    try:
        return serve(sock, engine, batches, parent)
    finally:
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


if __name__ == "__main__":
    exit_now(main())
