"""Client operations: each message a client sends, decoded, allowed or refused, and its op run.

decide joins the queue (a request with media only once the media checker has
passed its files); ping, status and models answer at once; the control ops
(clear_cache, drain, reload) are taken only on the control endpoint, from the
daemon's own user, and answer once they have finished. An op returns its
result, replied at once, or None where the reply comes later: a worker's
answer, every worker cleared, the queue drained, the new workers serving.
The supervisor's receive-from-clients phase hands each message here.
"""
from itertools import count

import zmq

from jevany_client.errors import (
    ForbiddenError,
    InvalidMessageError,
    InvalidRequestError,
    JevanyError,
    OverloadedError,
    ShuttingDownError,
)
from jevany_client.protocol import CONTROL_OPS, Request, decode_envelope, decode_request
from jevany_client.schema import Media, parse_decision, parse_media

from jevany_daemon import __version__
from jevany_daemon import channel, withdrawals

from .peers import may_control
from .request_queue import Entry
from .status import serving_model
from .worker_handle import STOPPING

# A message up to this size is decoded and checked whole in the loop: about
# 5 ms at most on a 2-core host, whatever its shape (4 KiB of empty maps, the
# costliest per byte). A bigger one is decoded only for its envelope and its media, its
# body skipped at C speed (decode_envelope), so that a megabyte of small values
# cannot hold the loop that serves everyone for a second; the worker that
# scores it decodes and checks it whole, and refuses it for its own.
CHECKED_WHOLE_BYTES = 4 << 10
_MEDIA = frozenset(("media",))


def decoded(payload: bytes) -> Request:
    """A client's message as the loop reads it: whole when small, else its envelope and media."""
    if len(payload) <= CHECKED_WHOLE_BYTES:
        return decode_request(payload)
    request = decode_envelope(payload, _MEDIA)
    if request.op != "decide":   # nothing else has a body worth reading, or a worker to check it
        raise InvalidMessageError(f"a {request.op} message is at most {CHECKED_WHOLE_BYTES:,} bytes, got "
                                  f"{len(payload):,}", request_id=request.id)
    return request


def decide_media(request: Request, payload: bytes) -> tuple[Media, ...]:
    """A decide body's media; a small body is checked whole, so a bad one is refused before it is queued."""
    if len(payload) <= CHECKED_WHOLE_BYTES:
        return parse_decision(request.body).media
    return parse_media(request.body)


def _bound_to(sock) -> str:
    try:
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)
    except zmq.ZMQError:
        return ""


class ClientOps:
    def __init__(self, *, clock, run_state, queue, media, gather, overloads, pool, clears, reloads, control,
                 replies, status, begin_drain):
        self.clock, self.run_state, self.queue, self.media = clock, run_state, queue, media
        self.gather, self.overloads, self.pool, self.clears = gather, overloads, pool, clears
        self.reloads, self.replies = reloads, replies
        self.control = control             # the control endpoint's socket, or None
        self.status = status               # status.StatusView: the status and models ops' figures
        self.begin_drain = begin_drain     # (exiting, cause) -> None
        self._tags = count(1)

    def handle(self, sock, envelope: list, payload: bytes) -> None:
        received = self.clock()
        if payload[:1] == withdrawals.MARK and self.replies.transport(sock) == "http":
            if (rid := withdrawals.decode(payload)) is not None:
                self.withdraw(envelope, rid)
                return
        try:
            request = decoded(payload)
        except JevanyError as exc:
            self.replies.refuse(sock, envelope, None, exc.request_id, exc)
            return
        try:
            if request.op in CONTROL_OPS and sock is not self.control:
                raise ForbiddenError(self._not_here(sock, request.op))
            if request.op in CONTROL_OPS and not may_control(envelope):
                raise ForbiddenError(f"{request.op} is a control op; only the daemon's own user may send it")
            handler = getattr(self, f"op_{request.op}")
            result = handler(sock, envelope, request, received, payload)
        except JevanyError as exc:
            self.replies.refuse(sock, envelope, request.op, request.id, exc)
            return
        if result is not None:
            self.replies.answer(sock, envelope, request.op, request.id, result)

    def _not_here(self, sock, op: str) -> str:
        """A control op sent to a public socket: where it goes instead. The control endpoint's address is
        said only to a client on this host (an ipc socket): a TCP or HTTP client may be anyone."""
        command = op.replace("_", "-")
        address = self.status.settings().control_endpoint
        if address is None:
            return (f"{op} is a control op, and this daemon's control endpoint is off (--control ''): "
                    "the operator must restart it with --control ADDRESS to take control ops")
        if self.replies.transport(sock) == "zmq" and _bound_to(sock).startswith("ipc://"):
            return (f"{op} is a control op; send it to this daemon's control endpoint, {address}: "
                    f"jevany-ctl {command} --control {address}")
        return (f"{op} is a control op; send it to the daemon's control endpoint, not this one: "
                f"jevany-ctl {command} --control ADDRESS, on the daemon's host")

    # --- decide ------------------------------------------------------------

    def op_decide(self, sock, envelope, request, received, payload):
        if self.run_state.winding_down:
            raise ShuttingDownError(f"the daemon is {self.run_state.state} and takes no new work")
        if self.run_state.failure:
            raise ShuttingDownError("the daemon is stopping")
        media = decide_media(request, payload)
        if media and self.media is None:
            raise InvalidRequestError(self._no_media())
        # Requests being checked count against --max-queue: each will join the queue.
        checking = self.media.pending() if self.media is not None else 0
        if len(self.queue) + checking >= self.queue.max_depth:
            self.overloads.hit(queue=len(self.queue), max_queue=self.queue.max_depth)
            raise OverloadedError(f"queue is full ({self.queue.max_depth} requests waiting); retry later")
        deadline = None if request.timeout_ms is None else received + request.timeout_ms / 1000
        # Queue the bytes, not the decoded body: a decoded msgpack value can be
        # tens of times its wire size, and the worker decodes it anyway.
        entry = Entry(next(self._tags), sock, envelope, request.id, payload, received, deadline,
                      self.replies.transport(sock), before_ready=self.run_state.state == "starting")
        self.gather.arrived(entry.client, received)
        if media:
            self.media.submit(entry, [[m.type, m.uri] for m in media])   # queued once checked
        else:
            self.queue.push(entry)
        return None    # the reply comes when a worker answers

    def _no_media(self) -> str:
        """Why a media request is refused where no media root is set: the model takes none, or the
        operator has not turned media on.

        A checkpoint (its description has a decision_mode) lists its media types whether or not a
        root is set; a plain causal LM is loaded for text alone without one, so its empty list says
        nothing of what it could take.
        """
        model = serving_model(self.pool)
        if model is None:        # no worker has described the model yet
            return "media is disabled; the server operator must set --media-root (or JEVANY_MEDIA_ROOT)"
        model_id, types = model.get("id"), model.get("media_types") or []
        if not types and model.get("decision_mode"):
            return f"model {model_id} takes no media; send the request without them"
        takes = f"takes {', '.join(types)}" if types else "is served for text only"
        return (f"media is disabled: model {model_id} {takes}, and the server operator has set no media root "
                "(--media-root, or JEVANY_MEDIA_ROOT)")

    def withdraw(self, envelope: list, rid: int) -> None:
        """An HTTP caller closed its connection before its answer (withdrawals.py): its request, if still
        queued, is dropped unscored, as a departed ZeroMQ client's is. One a worker holds is scored and
        its answer dropped by the gateway; one being checked for media is scored too (rare, and short)."""
        gateway = envelope[0]      # the gateway's connection: a restarted gateway counts its ids afresh
        entry = self.queue.withdraw(lambda e: e.id == rid and e.transport == "http" and e.envelope[0] == gateway)
        if entry is not None:
            self.replies.departed(entry)
        else:
            self.replies.withdrawn_late()

    def media_checked(self, entry: Entry, ok: bool, outcome) -> None:
        """A checked media request joins the queue (with its resolved files), or gets the policy's refusal.

        The queue has room for it: op_decide counted it against --max-queue while it was checked,
        and it leaves the checks as it joins the queue, so the two together never grow here."""
        if not ok:
            self.replies.reply_error(entry, InvalidRequestError(outcome))
        elif self.run_state.stopping_now:
            self.replies.reply_error(entry, ShuttingDownError("the daemon stopped before scoring this request"))
        else:
            entry.media = outcome
            self.queue.push(entry)

    # --- answered at once ----------------------------------------------------

    def op_ping(self, sock, envelope, request, received, payload):
        return {"pong": True, "version": __version__}

    def op_status(self, sock, envelope, request, received, payload):
        return self.status.status(private=self._private(sock, envelope))

    def op_models(self, sock, envelope, request, received, payload):
        return {"models": [self.status.model(private=self._private(sock, envelope))]}

    def _private(self, sock, envelope) -> bool:
        # The control endpoint's view (the cache counters) is for whoever may send its control ops: a
        # control socket its operator opened to everyone (0666) gives another user the public view.
        return sock is self.control and may_control(envelope)

    # --- control ops, answered once done -------------------------------------

    def op_clear_cache(self, sock, envelope, request, received, payload):
        ready = [w for w in self.pool.workers if w.ready_once and w.state != STOPPING and w.kill_cause is None]
        if not ready:
            return {"cleared": 0}
        for worker in ready:     # a busy worker answers once its batch is done
            self.pool.backend.send_multipart([worker.identity, channel.encode(channel.CLEAR)])
        self.clears.begin((sock, envelope, request.id), {w.identity for w in ready})
        self.replies.record(request.op, None)
        return None    # the reply comes when every worker has cleared (replies.cleared)

    def op_drain(self, sock, envelope, request, received, payload):
        self.begin_drain(exiting=False, cause="drain op")
        self.run_state.await_drain((sock, envelope, request.id))
        self.replies.record(request.op, None)
        return None

    def op_reload(self, sock, envelope, request, received, payload):
        self.reloads.begin(cause="reload op", waiter=(sock, envelope, request.id))
        return None    # the reply comes when the new workers serve, or the reload fails
