"""GPU-aware group commit: when an idle worker should wait a moment for the requests about to arrive.

Group commit hands an idle worker whatever is queued, so an idle daemon
adds no waiting. But when a pass costs about the same whatever its size (a
small model on a GPU), closed-loop clients split into cohorts: the clients
a pass just answered send their next request a fraction of a millisecond
later, after the next pass has already left with whoever was queued, and
every pass runs half full for nearly the cost of a full one.

So the supervisor learns two things from what it sees:

- what a pass costs by its size: the workers' pass records, smoothed per
  size class, fitted to cost = fixed + per_request x size. Merging two
  passes saves the fixed part, so waiting pays only while it is shorter
  than that: a wait may spend up to it (FIXED_SHARE), never more than
  MAX_WAIT_S. Not less: clients that are waited for come back during it,
  where a pass sent without them would be followed by one of their own
  (a share of 0.5, on the simulated accelerator, turned waiting off
  whenever the clients' return passed 12.5 ms of a 25 ms fixed cost, and
  their 32 requests went as 30 and 2, one pass after another);
- how soon an answered client asks again: the time from a decide reply to
  that client's next decide, the median of the latest RETURN_SAMPLES. A
  median, not a mean: closed-loop clients sharing a few cores come back
  spread out, a few of them late, and a mean near the window's end would
  flip waiting on and off from one pass to the next, each "off" sending
  the clients back first in a pass of their own for nearly a full pass's
  cost. A worker's answers count as given when they reach the supervisor
  (worker_events.py), before the dispatch that the same turn runs ahead of
  sending them.

A worker that is free waits while clients answered within the last wait
window have not yet come back, up to the window's end, and only when they
usually (the median) come back within it. Only clients seen coming back
before are waited for: one that sends a single request and leaves would
otherwise hold every pass it was answered in for a whole window. Requests
through the HTTP gateway all come on its one connection, so their users
cannot be told apart: they are never waited for. A lone client is never
waited for: by the time its request is queued it has come back. Once a
full pass is queued, nothing waits.
"""
import statistics
from collections import deque
from dataclasses import dataclass, field

from jevany_daemon.channel import PassRecord

MAX_WAIT_S = 0.025      # the longest a free worker waits for answered clients to come back
FIXED_SHARE = 1.0       # of a pass's fixed cost, what one wait may spend to save it
SMOOTHING = 0.2         # weight of the newest sample in the running averages of pass costs
RETURN_SAMPLES = 64     # the latest return times whose median says how soon clients come back
MIN_CLASSES = 2         # size classes measured before the fit is trusted
MAX_CLIENTS = 4096      # answered clients remembered at most (one-shot clients never come back)


def size_class(size: int) -> int:
    return max(1, size).bit_length()     # 1, 2-3, 4-7, 8-15, 16-31, ...


@dataclass
class PassCost:
    """Seconds per pass by size class: (mean size, mean seconds), smoothed."""
    classes: dict[int, tuple[float, float]] = field(default_factory=dict)

    def record(self, size: int, seconds: float) -> None:
        if size < 1 or seconds <= 0:
            return
        k = size_class(size)
        old = self.classes.get(k)
        self.classes[k] = (size, seconds) if old is None else (
            (1 - SMOOTHING) * old[0] + SMOOTHING * size, (1 - SMOOTHING) * old[1] + SMOOTHING * seconds)

    def fixed_s(self) -> float:
        """The part of a pass's cost that does not grow with its size (least squares over the classes)."""
        if len(self.classes) < MIN_CLASSES:
            return 0.0
        points = list(self.classes.values())
        n = len(points)
        mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
        sxx = sum((x - mx) ** 2 for x, _ in points)
        slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
        return max(0.0, my - max(0.0, slope) * mx)


class Gather:
    def __init__(self, max_wait_s: float = MAX_WAIT_S):
        self.max_wait_s = max_wait_s
        self.cost = PassCost()
        self.returns: deque = deque(maxlen=RETURN_SAMPLES)     # seconds from an answer to that client's next ask
        self._answered: dict[object, tuple[int, float]] = {}    # client -> (replies not yet followed, last at)
        self._returning: dict[object, None] = {}    # clients seen coming back after an answer: the ones waited for

    # --- what the supervisor sees -------------------------------------------

    def answered(self, client, now: float) -> None:
        """A decide reply went to this client (None: one not told apart, never waited for)."""
        if client is None:
            return
        count, _ = self._answered.pop(client, (0, now))
        self._answered[client] = (count + 1, now)      # newest last
        while len(self._answered) > MAX_CLIENTS:
            del self._answered[next(iter(self._answered))]

    def arrived(self, client, now: float) -> None:
        """A decide came from this client."""
        entry = self._answered.get(client)
        if entry is None:
            return
        count, at = entry
        self.returns.append(now - at)
        self._returning.pop(client, None)
        self._returning[client] = None          # newest last
        while len(self._returning) > MAX_CLIENTS:
            del self._returning[next(iter(self._returning))]
        if count <= 1:
            del self._answered[client]
        else:
            self._answered[client] = (count - 1, at)

    def passes(self, records: list) -> None:
        """Workers' passes (channel.PassRecord): what each cost, for those that ran whole."""
        for record in map(PassRecord.read, records):
            if record.ok:
                self.cost.record(int(record.size), float(record.latency_ms) / 1000)

    @property
    def return_s(self) -> float | None:
        """How soon an answered client asks again: the median of the latest returns."""
        return statistics.median(self.returns) if self.returns else None

    # --- the decision -----------------------------------------------------------

    def wait_s(self) -> float:
        """How long a free worker may wait for answered clients: 0 where the measurements do not justify it."""
        wait = min(self.max_wait_s, FIXED_SHARE * self.cost.fixed_s())
        back = self.return_s
        if back is None or back > wait:
            return 0.0
        return wait

    def hold_until(self, queued: int, full: int, now: float) -> float | None:
        """Until when a free worker should wait before taking the queue; None: take it now."""
        if queued >= full:
            return None
        wait = self.wait_s()
        if wait <= 0:
            return None
        expected, last = 0, None
        for client, (count, at) in list(self._answered.items()):
            if now - at > wait:
                del self._answered[client]     # not back within the window: not waited for again
                # Its late return goes unsampled, so the median leans early; but it is waited for again
                # only once it has come back again. (Sampling it here as late would count every client
                # idle for a while as late: after a pause, waiting would stay off for two passes.)
                self._returning.pop(client, None)
                continue
            if client in self._returning:      # a client never seen coming back (one request, say) is not waited for
                expected += count
                last = at if last is None else max(last, at)
        if expected == 0:
            return None
        return last + wait

    def as_dict(self) -> dict:
        return {"wait_ms": round(self.wait_s() * 1000, 3),
                "fixed_pass_ms": round(self.cost.fixed_s() * 1000, 3),
                "return_ms": None if self.return_s is None else round(self.return_s * 1000, 3)}
