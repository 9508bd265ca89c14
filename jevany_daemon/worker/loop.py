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
from dataclasses import dataclass

import zmq

from jevany_client.calls import has_message
from jevany_client.errors import DeadlineExceededError, InternalError, JevanyError
from jevany_client.protocol import decode_request

from jevany_daemon.engine.faults import DeviceLost
from jevany_daemon.media.files import PrivateCopies, read_verified

from jevany_daemon import channel
from jevany_daemon.logs import event

log = logging.getLogger("jevany.worker")

PARENT_CHECK_MS = 1000


class WorkerLoop:
    def __init__(self, sock, engine, batches: list, parent: int, collector=None):
        self.sock, self.engine, self.batches, self.parent = sock, engine, batches, parent
        self.collector = collector      # collector.CollectorWatch: its totals go with the statistics
        self.received: list = []        # hand-over items not admitted yet
        self.queue: deque = deque()     # admitted, as Pending (item: Admitted), waiting for a pass
        self.held: dict[int, Held] = {}     # id(Admitted) -> what the worker keeps of it until it is answered
        self.ready: list = []           # channel.Answer for each request answered since the last message
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
        bodies, origins, tenants, held = [], [], [], []
        now = time.monotonic()
        for item in map(channel.HandedOver.read, items):
            mine = PrivateCopies()     # checked media, decoded from here rather than from their paths
            try:
                bodies.append(_body(item.payload, item.media, mine))
            except Exception as exc:   # noqa: BLE001 - becomes this request's typed or internal error
                mine.close()
                if not isinstance(exc, JevanyError):
                    exc = InternalError(f"admission failed: {type(exc).__name__}: {exc}")
                self.ready.append(_wire(item.tag, exc))
                continue
            origins.append(item.transport)
            tenants.append(item.tenant)
            # From when the supervisor sent it (one host, one monotonic clock): a hand-over can sit
            # unread while a pass is dispatched or answered, and that time is the request's too.
            sent = now if item.sent_at is None else float(item.sent_at)
            held.append(Held(item.tag, None if item.left is None else sent + float(item.left), mine))
        for record, admitted in zip(held, self.engine.admit_many(bodies, origins, tenants)):
            if isinstance(admitted, JevanyError):
                record.copies.close()
                self.ready.append(_wire(record.tag, admitted))
            else:
                self.held[id(admitted)] = record
                self.queue.append(self.engine.pending(admitted))

    def launch(self) -> None:
        if self.launched is None and self.queue:
            self.expire()
        if self.launched is None and self.queue:
            batch = [p.item for p in self.engine.take(self.queue)]
            for admitted in batch:
                self.held[id(admitted)].deadline = None     # its pass has begun: it is scored now
            self.launched = self.engine.launch(batch)

    def expire(self) -> None:
        """Answer deadline_exceeded for what waited here past its deadline: it is never scored.

        The supervisor keeps deadlines while requests are queued; a worker that
        overlaps its device takes the next pass's worth early, so it keeps them
        for what it holds until that pass begins.
        """
        now = time.monotonic()
        if not any(self.held[id(p.item)].past(now) for p in self.queue):
            return
        kept = deque()
        for pending in self.queue:
            if self.held[id(pending.item)].past(now):
                error = DeadlineExceededError("timeout_ms passed before scoring began")
                self.ready.append(self._answered(pending.item, error))
            else:
                kept.append(pending)
        self.queue = kept

    def collect(self) -> None:
        launched = self.launched
        if launched is None:
            if self.ready:
                self.answer()
            return
        asynchronous = self.engine.asynchronous
        if asynchronous:
            # While the device runs: what the supervisor handed over meanwhile joins the queue.
            # (On a CPU the pass is done already: its answers go before anything new is admitted.)
            self.receive()
            self.admit()
        self.engine.wait(launched)
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
        outcomes = self.engine.finish(launched)
        for admitted, outcome in zip(launched.batch, outcomes):
            self.ready.append(self._answered(admitted, outcome))
        self.answer()

    def _answered(self, admitted, outcome) -> channel.Answer:
        """The request's answer; the worker keeps nothing of it from now on (its media copies closed)."""
        record = self.held.pop(id(admitted))
        record.copies.close()
        return _wire(record.tag, outcome)

    def answer(self) -> None:
        """The replies ready, with the statistics and the passes run since the last message."""
        answers, self.ready = self.ready, []
        kind = channel.EARLY if self.busy else channel.RESULTS
        records = [channel.PassRecord(r.size, r.padded_tokens, r.real_tokens, r.latency_ms, r.ok, list(r.origins))
                   for r in self.batches]
        self.batches.clear()
        stats = self.engine.statistics()
        if self.collector is not None:
            stats["collector"] = self.collector.as_dict()
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


@dataclass
class Held:
    """What the worker keeps of a request it admitted, until it is answered."""
    tag: int                      # the supervisor's, for the answer
    deadline: float | None        # host monotonic time it must not be scored after; None once its pass began
    copies: PrivateCopies         # its media's private copies (none without media)

    def past(self, now: float) -> bool:
        return self.deadline is not None and self.deadline <= now


def _wire(tag, outcome) -> channel.Answer:
    if isinstance(outcome, JevanyError):
        return channel.Answer(tag, False, outcome.to_wire())
    return channel.Answer(tag, True, outcome)

