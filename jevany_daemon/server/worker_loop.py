"""The worker's one loop: keep a pass on the device while the host admits, forms and answers around it.

Each turn runs the same phases, in order:

    receive → admit → launch → collect → answer

- receive: everything the supervisor sent (hand-overs, clear, stop); it
  blocks only when nothing is queued and nothing is on the device.
- admit: validate and encode what was handed over, every request of a turn
  in one batched tokenization; a request that breaks a rule is answered in
  this turn's message.
- launch: with the device free, queue the next pass (the batch policy and
  limits choose it from what is admitted: engine.take), after answering
  deadline_exceeded for what waited past its deadline.
- collect: wait for the pass on the device: the one sync per pass. On an
  accelerator (CUDA, or the simulated one) the next pass is launched right
  after, before this one's answers are shaped, so the device is never idle
  while the host works; on a CPU a pass runs when it is launched, so its
  answers go first.
- answer: the pass's replies, as EARLY while the worker holds more work,
  RESULTS when it holds none (with the sequence number of the last
  hand-over it had read, so the supervisor knows whether a later one is
  still on its way).
"""
import logging
import os
import time
from collections import deque

import zmq

from jevany_client.calls import has_message
from jevany_client.errors import DeadlineExceededError, InternalError, JevanyError
from jevany_client.protocol import decode_request

from jevany_daemon.engine.faults import DeviceLost
from jevany_daemon.media.files import PrivateCopies, read_verified

from . import channel
from .logs import event

log = logging.getLogger("jevany.worker")

PARENT_CHECK_MS = 1000


class WorkerLoop:
    def __init__(self, sock, engine, batches: list, parent: int):
        self.sock, self.engine, self.batches, self.parent = sock, engine, batches, parent
        self.received: list = []        # hand-over items not admitted yet
        self.queue: deque = deque()     # admitted, as Pending (item: Admitted), waiting for a pass
        self.tags: dict[int, object] = {}   # id(Admitted) -> the supervisor's tag
        self.deadlines: dict[int, float] = {}   # id(Admitted) -> monotonic time it must not be scored after
        self.copies: dict[int, PrivateCopies] = {}   # id(Admitted) -> its media's private copies, until answered
        self.ready: list = []           # [tag, ok, result or error] to send with the next answer
        self.launched = None            # the pass on the device
        self.seq = 0                    # the last hand-over read
        self.stopping = False

    @property
    def busy(self) -> bool:
        return bool(self.received or self.queue or self.launched is not None or self.ready)

    def run(self) -> int:
        """Serve until told to stop, or until the supervisor (pid parent) is gone; the exit code."""
        try:
            while not (self.stopping and not self.busy):
                if not self.receive():
                    return 0
                self.admit()
                self.launch()
                self.collect()
        except DeviceLost as exc:
            # The CUDA context is unusable: exit, so the supervisor answers what this
            # worker held with worker_lost and starts a fresh process on a fresh context.
            event(log, "worker_device_lost", level=logging.ERROR, error=str(exc))
            return channel.EXIT_DEVICE_LOST
        return 0

    # --- phases --------------------------------------------------------------

    def receive(self) -> bool:
        """Take every message waiting; wait for one only when idle. False: the supervisor is gone."""
        while not self.busy and not self.stopping:
            if self.sock.poll(PARENT_CHECK_MS):
                break
            if os.getppid() != self.parent:
                event(log, "worker_exit", cause="supervisor gone")
                return False
        while has_message(self.sock):
            try:
                message = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return True
            self.handle(channel.decode(message))
        return True

    def handle(self, message: list) -> None:
        kind, *args = message
        if kind == channel.BATCH:
            self.received += args[0]
            self.seq = args[1] if len(args) > 1 else self.seq + 1
        elif kind == channel.CLEAR:
            self.sock.send(channel.encode(channel.CLEARED, self.engine.clear_prefix_cache(),
                                          self.engine.prefix_cache_stats()))
        elif kind == channel.STOP:
            self.stopping = True

    def admit(self) -> None:
        if not self.received:
            return
        items, self.received = self.received, []
        bodies, tags, origins, tenants, deadlines, copies = [], [], [], [], [], []
        now = time.monotonic()
        for tag, payload, *extra in items:
            origin, media, left, tenant, sent_at = (extra + [None] * 5)[:5]
            mine = PrivateCopies()     # checked media, decoded from here rather than from their paths
            try:
                bodies.append(_body(payload, media, mine))
            except Exception as exc:   # noqa: BLE001 - becomes this request's typed or internal error
                mine.close()
                if not isinstance(exc, JevanyError):
                    exc = InternalError(f"admission failed: {type(exc).__name__}: {exc}")
                self.ready.append(_wire(tag, exc))
                continue
            tags.append(tag)
            origins.append(origin)
            tenants.append(tenant)
            # From when the supervisor sent it (one host, one monotonic clock): a hand-over can sit
            # unread while a pass is dispatched or answered, and that time is the request's too.
            deadlines.append(None if left is None else (now if sent_at is None else float(sent_at)) + float(left))
            copies.append(mine)
        admitted_all = self.engine.admit_many(bodies, origins, tenants)
        for tag, deadline, mine, admitted in zip(tags, deadlines, copies, admitted_all):
            if isinstance(admitted, JevanyError):
                mine.close()
                self.ready.append(_wire(tag, admitted))
            else:
                self.tags[id(admitted)] = tag
                if deadline is not None:
                    self.deadlines[id(admitted)] = deadline
                if mine.fds:
                    self.copies[id(admitted)] = mine
                self.queue.append(self.engine.pending(admitted))

    def launch(self) -> None:
        if self.launched is None and self.queue:
            self.expire()
        if self.launched is None and self.queue:
            batch = [p.item for p in self.engine.take(self.queue)]
            for admitted in batch:
                self.deadlines.pop(id(admitted), None)
            self.launched = self.engine.launch(batch)

    def expire(self) -> None:
        """Answer deadline_exceeded for what waited here past its deadline: it is never scored.

        The supervisor keeps deadlines while requests are queued; a worker that
        overlaps its device takes the next pass's worth early, so it keeps them
        for what it holds until that pass begins.
        """
        if not self.deadlines:
            return
        now, kept = time.monotonic(), deque()
        for pending in self.queue:
            key = id(pending.item)
            if self.deadlines.get(key, now + 1) <= now:
                del self.deadlines[key]
                self._release(key)
                error = DeadlineExceededError("timeout_ms passed before scoring began")
                self.ready.append(_wire(self.tags.pop(key), error))
            else:
                kept.append(pending)
        self.queue = kept

    def collect(self) -> None:
        launched = self.launched
        if launched is None:
            if self.ready:
                self.answer()
            return
        asynchronous = self.engine.stream.asynchronous
        if asynchronous:
            # While the device runs: what the supervisor handed over meanwhile joins the queue.
            # (On a CPU the pass is done already: its answers go before anything new is admitted.)
            self.receive()
            self.admit()
        self.engine.passes.wait(launched)
        if asynchronous:
            # And what came during the wait: the supervisor hands the next pass's worth over when this
            # pass's EARLY reaches it, which is mostly while the worker waits. Read before the launch, or
            # it would wait until this pass is answered, the device idle meanwhile. (Still busy: this
            # reads what is there and never blocks.)
            self.receive()
            self.admit()
        self.launched = None
        if asynchronous:
            self.launch()         # the device starts the next pass while this one is answered
        outcomes = self.engine.passes.finish(launched)
        for admitted, outcome in zip(launched.batch, outcomes):
            self._release(id(admitted))
            self.ready.append(_wire(self.tags.pop(id(admitted)), outcome))
        self.answer()

    def _release(self, key: int) -> None:
        copies = self.copies.pop(key, None)
        if copies is not None:
            copies.close()

    def answer(self) -> None:
        """The replies ready, with the statistics and the passes run since the last message."""
        answers, self.ready = self.ready, []
        kind = channel.EARLY if self.busy else channel.RESULTS
        records = [[r.size, r.padded_tokens, r.real_tokens, r.latency_ms, r.ok, list(r.origins)] for r in self.batches]
        self.batches.clear()
        stats = self.engine.stats.as_dict() | {"device_info": device_info(self.engine),
                                               "prefix_cache": self.engine.prefix_cache_stats(),
                                               "plan": self.engine.plan_stats()}
        self.sock.send(channel.encode(kind, answers, stats, records, self.seq))


def _body(payload: bytes, media, copies: PrivateCopies) -> dict:
    """A request's body as the worker scores it. The supervisor already accepted the message;
    decoding it again here, with the same strict decoder, is what keeps queued requests at their
    wire size. Media: the bytes the checker checked, read once more and verified, then decoded
    from this process's own copy, never from a path another user could swap (media/files.py)."""
    body = decode_request(payload).body
    if media:
        body = {**body, "media": [{"type": kind, "uri": copies.add(read_verified(path, checked))}
                                  for kind, path, checked in media]}
    return body


def _wire(tag, outcome) -> list:
    if isinstance(outcome, JevanyError):
        return [tag, False, outcome.to_wire()]
    return [tag, True, outcome]


def device_info(engine) -> dict:
    from jevany_daemon.model.devices import devices_report    # torch: imported once the model is

    return devices_report(engine.model.devices)
