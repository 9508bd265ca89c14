"""What the supervisor's loop runs on, opened before its first turn and closed after its last.

start: the descriptor limit, the ZeroMQ context, CurveZMQ's handler, the
client sockets (public, then control), the workers' private socket, the media
checker, the signal flags, the metrics endpoint, the HTTP gateway, then the
first generation of workers; returned as one frozen Wiring, built only from
what start is given. close: the client sockets first, then everything else,
each only if it was opened: a start that fails part-way closes what it had
opened before it raises. end: the metrics and systemd's socket, which the
supervisor holds from before start, then the stop event.
"""
import ctypes
import errno
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, fields

import zmq

from jevany_daemon import __version__
from jevany_daemon.logs import event

from . import curve, fds
from .gateway_handle import GatewayProcess
from .inbox import Inbox
from .media_checks import MediaChecks
from .outbox import Outbox
from .peers import Peers
from .pool import WorkerPool
from .signals import SignalFlags
from .sockets import StartupError, bind_router
from .worker_handle import tunes_malloc

log = logging.getLogger("jevany.supervisor")

BATCHING_OFF = ("each request runs in a pass of its own; --max-batch-size 32 (JEVANY_MAX_BATCH_SIZE) "
                "lets concurrent requests share passes")


# glibc raises its mmap threshold to the size of each mapped block it frees (up to 32 MiB), so after
# the first big message the next ones come from the heap, which goes back to the OS only from its top:
# replies of 7 MB held for 8 clients that read nothing left the supervisor at 418 MB (72 before), though
# what it still held was 67 MB. Kept at glibc's starting value, every block from 128 KiB up is mapped,
# and unmapped when freed: 101 MB (44 before). Such blocks are rare here (big requests and replies),
# so mapping each costs little. An operator's own MALLOC_* setting wins, as for the workers.
MMAP_THRESHOLD = 128 << 10
_M_MMAP_THRESHOLD = -3       # mallopt's parameter number in glibc's malloc.h


@dataclass(frozen=True)
class Wiring:
    """What start opened. A part not opened (a start cut short; no --media-root, --http) is None or empty."""
    fd_limit: int | None = None
    ctx: zmq.Context | None = None
    poller: zmq.Poller | None = None
    peers: Peers | None = None
    outbox: Outbox | None = None
    inbox: Inbox | None = None
    zap: curve.ZapHandler | None = None     # CurveZMQ's handler, with --curve
    listeners: tuple = ()                   # every bound client endpoint (sockets.Listener)
    public: tuple = ()
    control: zmq.Socket | None = None
    fd_guard: fds.FdGuard | None = None
    rundir: str | None = None               # the workers' (and gateway's, media checker's) ipc files
    backend: zmq.Socket | None = None
    pool: WorkerPool | None = None
    media: MediaChecks | None = None        # the media checker, with --media-root
    signals: SignalFlags | None = None
    metrics_url: str | None = None
    gateway: GatewayProcess | None = None   # the HTTP gateway, with --http

    def client_sockets(self) -> list:
        """Every socket a client message comes in on."""
        gateway = [self.gateway.sock] if self.gateway is not None else []
        return list(self.public) + ([self.control] if self.control else []) + gateway


class _Opening:
    """The parts as they open, so that a start cut short knows what to close."""

    def __init__(self):
        for f in fields(Wiring):
            setattr(self, f.name, list(f.default) if isinstance(f.default, tuple) else f.default)

    def wiring(self) -> Wiring:
        return Wiring(**{f.name: tuple(v) if isinstance(v := getattr(self, f.name), list) else v
                         for f in fields(Wiring)})


def start(settings, clock, metrics, busy_fds) -> Wiring:
    """busy_fds: () -> the descriptors of peers holding a request (fds.FdGuard never closes those)."""
    opening = _Opening()
    try:
        _open(opening, settings, clock, metrics, busy_fds)
    except BaseException:
        close(opening.wiring())      # what was opened, in close's order; the caller reports the failure
        raise
    wiring = opening.wiring()
    event(log, "start", version=__version__, endpoints=",".join(settings.endpoints),
          control=settings.control_endpoint or "none", model=settings.model or "tiny-demo",
          workers=settings.worker_count, devices=",".join(settings.worker_devices()),
          max_batch_size=settings.engine.max_batch_size, max_queue=settings.max_queue,
          curve="on" if wiring.zap else "off", metrics=wiring.metrics_url or "off",
          http=f"http://{settings.http}" if wiring.gateway else "off")
    if settings.engine.max_batch_size == 1:
        # JevAny's default, kept; but concurrent clients then queue for passes of one, and nothing else says so.
        event(log, "batching_off", note=BATCHING_OFF)
    return wiring


def _open(o: _Opening, settings, clock, metrics, busy_fds) -> None:
    _map_big_blocks()
    o.fd_limit = fds.raise_limit()     # before any socket: headroom for clients costs nothing unused
    o.ctx = zmq.Context()
    o.poller = zmq.Poller()
    o.peers = Peers(o.poller, clock)
    o.outbox = Outbox(o.peers, clock)
    o.inbox = Inbox(o.peers, clock)
    keys = _start_curve(o, settings, clock)
    for endpoint in settings.endpoints:
        o.public.append(_bind_client_socket(o, settings, keys, endpoint, flag="--bind"))
    public_listeners = list(o.listeners)
    if settings.control_endpoint:
        o.control = _bind_client_socket(o, settings, keys, settings.control_endpoint, mode=0o600, flag="--control")
    # The control endpoint keeps listening under pressure: only its owner can reach it.
    o.fd_guard = fds.FdGuard(o.peers, public_listeners, busy_fds, clock, o.fd_limit)
    _start_backend(o, clock)
    if settings.media_root:
        o.media = MediaChecks(o.ctx, o.poller, o.rundir, settings, clock)
    o.signals = SignalFlags(o.poller)
    o.metrics_url = _serve_metrics(settings, metrics)
    _start_gateway(o, settings, clock)
    o.pool.start_generation(settings)


def close(w: Wiring) -> None:
    # Client sockets first: a client connected to several daemons sees this one go at once
    # and sends elsewhere whatever it still awaits from here (final replies still leave: LINGER).
    if w.peers is not None:
        w.peers.close_monitors()     # their PAIR sockets would hold ctx.term() for ever
    for sock in [*w.public, w.control]:
        if sock is not None:
            sock.close()
    if w.gateway is not None:
        w.gateway.close()       # after the drain: its callers have had their replies
    if w.media is not None:
        w.media.close()         # empty by now: the drain waited for its checks
    if w.pool is not None:
        w.pool.stop_all()
    if w.backend is not None:
        w.backend.close()
    if w.zap is not None:
        w.zap.close()
    if w.ctx is not None:
        w.ctx.term()
    for listener in w.listeners:
        listener.remove_file()      # only while it is still ours: never another user's socket
    if w.rundir:
        shutil.rmtree(w.rundir, ignore_errors=True)
    if w.signals is not None:
        w.signals.close()


def end(metrics, notifier, exit_code: int, failure: str | None) -> None:
    """After close (or a start that failed): what the supervisor held from before start, then the stop event."""
    metrics.close()
    notifier.close()
    event(log, "stop", exit_code=exit_code, **({"error": failure} if failure else {}))


def _start_curve(o: _Opening, settings, clock) -> tuple | None:
    """The server's keys, with --curve; the ZAP handler that checks each client's."""
    if not settings.curve:
        return None
    try:
        keys = curve.load_server_keys(settings.curve_secret_key)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    o.zap = curve.ZapHandler(o.ctx, settings.curve_allowed_clients, clock)
    o.poller.register(o.zap.sock, zmq.POLLIN)
    return keys


def _start_backend(o: _Opening, clock) -> None:
    o.rundir = tempfile.mkdtemp(prefix="jevany-workers-")   # 0700: only we reach the workers
    endpoint = f"ipc://{o.rundir}/backend.sock"
    o.backend = o.ctx.socket(zmq.ROUTER)
    o.backend.setsockopt(zmq.LINGER, 0)
    o.backend.bind(endpoint)
    o.poller.register(o.backend, zmq.POLLIN)
    o.pool = WorkerPool(o.backend, endpoint, o.poller, clock)


def _serve_metrics(settings, metrics) -> str | None:
    """The metrics endpoint's URL, with --metrics-port."""
    if settings.metrics_port is None:
        return None
    host = settings.metrics_host
    shown = f"[{host}]" if ":" in host else host
    try:
        port = metrics.serve(settings.metrics_port, host)
    except OSError as exc:
        where = f"cannot serve metrics on {shown}:{settings.metrics_port}"
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(f"{where} (--metrics-port): {os.strerror(exc.errno)}; choose another "
                               "--metrics-port, or --metrics-port 0 for a free one (status and the start-up log "
                               "show which)") from None
        raise StartupError(f"{where} (--metrics-host, --metrics-port): {exc}") from None
    return f"http://{shown}:{port}/metrics"


def _start_gateway(o: _Opening, settings, clock) -> None:
    if settings.http is None:
        return
    o.gateway = GatewayProcess(o.ctx, o.poller, o.rundir, settings, clock)
    o.inbox.gateway_sock = o.gateway.sock
    o.gateway.start(o.metrics_url)


def _bind_client_socket(o: _Opening, settings, keys, endpoint: str, flag: str, mode: int | None = None):
    """Bound, and watched: its peers (peers.py), its messages (inbox.py), poll."""
    sock, listener = bind_router(o.ctx, endpoint, settings.max_message_bytes, keys,
                                 settings.socket_mode if mode is None else mode, flag=flag)
    o.listeners.append(listener)
    o.peers.watch(sock)
    o.inbox.watched.add(sock)
    o.poller.register(sock, zmq.POLLIN)
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
