"""What the supervisor's loop runs on, opened before its first turn and closed after its last.

start: the descriptor limit, the ZeroMQ context, CurveZMQ's handler, the
client sockets (public, then control), the workers' private socket, the media
checker, the signal flags, the metrics endpoint, the HTTP gateway, then the
first generation of workers. close: the client sockets first, then everything
else, each only if it was opened (a start can fail part-way).
"""
import ctypes
import logging
import os
import shutil
import tempfile

import zmq

from jevany_daemon import __version__

from . import curve, fds
from .gateway import GatewayProcess
from .inbox import Inbox
from .logs import event
from .media_checks import MediaChecks
from .outbox import Outbox
from .peers import Peers
from .pool import WorkerPool
from .signals import SignalFlags
from .sockets import StartupError, bind_router
from .workers import tunes_malloc

log = logging.getLogger("jevany.supervisor")


# glibc raises its mmap threshold to the size of each mapped block it frees (up to 32 MiB), so after
# the first big message the next ones come from the heap, which goes back to the OS only from its top:
# replies of 7 MB held for 8 clients that read nothing left the supervisor at 418 MB (72 before), though
# what it still held was 67 MB. Kept at glibc's starting value, every block from 128 KiB up is mapped,
# and unmapped when freed: 101 MB (44 before). Such blocks are rare here (big requests and replies),
# so mapping each costs little. An operator's own MALLOC_* setting wins, as for the workers.
MMAP_THRESHOLD = 128 << 10
_M_MMAP_THRESHOLD = -3       # mallopt's parameter number in glibc's malloc.h


def start(sup) -> None:
    _map_big_blocks()
    sup.fd_limit = fds.raise_limit()     # before any socket: headroom for clients costs nothing unused
    sup.ctx = zmq.Context()
    sup.poller = zmq.Poller()
    sup.peers = Peers(sup.poller, sup.clock)
    sup.outbox = Outbox(sup.peers, sup.clock)
    sup.inbox = Inbox(sup.peers, sup.clock)
    _start_curve(sup)
    sup.public = [_bind_client_socket(sup, ep, flag="--bind") for ep in sup.settings.endpoints]
    public_listeners = list(sup._listeners)
    control = sup.settings.control_endpoint
    sup.control = _bind_client_socket(sup, control, mode=0o600, flag="--control") if control else None
    # The control endpoint keeps listening under pressure: only its owner can reach it.
    sup.fd_guard = fds.FdGuard(sup.peers, public_listeners, sup.busy_fds, sup.clock, sup.fd_limit)
    _start_backend(sup)
    if sup.settings.media_root:
        sup.media = MediaChecks(sup.ctx, sup.poller, sup._rundir, sup.settings, sup.clock)
    sup.signals = SignalFlags(sup.poller)
    _start_metrics(sup)
    _start_gateway(sup)
    sup.pool.start_generation(sup.settings)
    event(log, "start", version=__version__, endpoints=",".join(sup.settings.endpoints),
          control=control or "none", model=sup.settings.model or "tiny-demo",
          workers=sup.settings.worker_count, devices=",".join(sup.settings.worker_devices()),
          max_batch_size=sup.settings.engine.max_batch_size, max_queue=sup.settings.max_queue,
          curve="on" if sup.zap else "off", metrics=sup.metrics_url or "off",
          http=f"http://{sup.settings.http}" if sup.gateway else "off")


def close(sup) -> None:
    # Client sockets first: a client connected to several daemons sees this one go at once
    # and sends elsewhere whatever it still awaits from here (final replies still leave: LINGER).
    if hasattr(sup, "peers"):
        sup.peers.close_monitors()     # their PAIR sockets would hold ctx.term() for ever
    for sock in getattr(sup, "public", []) + [getattr(sup, "control", None)]:
        if sock is not None:
            sock.close()
    if sup.gateway is not None:
        sup.gateway.close()       # after the drain: its callers have had their replies
    if sup.media is not None:
        sup.media.close()         # empty by now: the drain waited for its checks
    if hasattr(sup, "pool"):
        sup.pool.stop_all()
    if hasattr(sup, "backend"):
        sup.backend.close()
    if sup.zap is not None:
        sup.zap.close()
    if hasattr(sup, "ctx"):
        sup.ctx.term()
    for listener in sup._listeners:
        listener.remove_file()      # only while it is still ours: never another user's socket
    if getattr(sup, "_rundir", None):
        shutil.rmtree(sup._rundir, ignore_errors=True)
    if sup.signals is not None:
        sup.signals.close()
    sup.metrics.close()
    sup.notifier.close()
    failure = sup.run_state.failure
    event(log, "stop", exit_code=sup.run_state.exit_code, **({"error": failure} if failure else {}))


def _start_curve(sup) -> None:
    if not sup.settings.curve:
        return
    try:
        sup._curve_keys = curve.load_server_keys(sup.settings.curve_secret_key)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    sup.zap = curve.ZapHandler(sup.ctx, sup.settings.curve_allowed_clients, sup.clock)
    sup.poller.register(sup.zap.sock, zmq.POLLIN)


def _start_backend(sup) -> None:
    sup._rundir = tempfile.mkdtemp(prefix="jevany-workers-")   # 0700: only we reach the workers
    endpoint = f"ipc://{sup._rundir}/backend.sock"
    sup.backend = sup.ctx.socket(zmq.ROUTER)
    sup.backend.setsockopt(zmq.LINGER, 0)
    sup.backend.bind(endpoint)
    sup.poller.register(sup.backend, zmq.POLLIN)
    sup.pool = WorkerPool(sup.backend, endpoint, sup.poller, sup.clock)


def _start_metrics(sup) -> None:
    if sup.settings.metrics_port is None:
        return
    host = sup.settings.metrics_host
    shown = f"[{host}]" if ":" in host else host
    try:
        port = sup.metrics.serve(sup.settings.metrics_port, host)
    except OSError as exc:
        raise StartupError(f"cannot serve metrics on {shown}:{sup.settings.metrics_port}: {exc}") from None
    sup.metrics_url = f"http://{shown}:{port}/metrics"


def _start_gateway(sup) -> None:
    if sup.settings.http is None:
        return
    sup.gateway = GatewayProcess(sup.ctx, sup.poller, sup._rundir, sup.settings, sup.clock)
    sup.inbox.gateway_sock = sup.gateway.sock
    sup.gateway.start(sup.metrics_url)


def _bind_client_socket(sup, endpoint: str, flag: str, mode: int | None = None):
    keys = sup._curve_keys if sup.zap is not None else None
    sock, listener = bind_router(sup.ctx, endpoint, sup.settings.max_message_bytes, keys,
                                 sup.settings.socket_mode if mode is None else mode, flag=flag)
    sup._listeners.append(listener)
    sup.peers.watch(sock)
    sup.inbox.watched.add(sock)
    sup.poller.register(sock, zmq.POLLIN)
    return sock


def _map_big_blocks() -> None:
    """Keep glibc's mmap threshold at MMAP_THRESHOLD (other C libraries: nothing to do)."""
    if tunes_malloc(os.environ):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
