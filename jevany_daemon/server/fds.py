"""File descriptors: how many the supervisor may hold, how many it holds, and what it does near the limit.

Every connected client costs the supervisor a descriptor, and libzmq accepts
connections in its own thread. When accept() finds none left, libzmq's ipc
listener aborts the whole process (EMFILE is not among the errors it
tolerates), taking the workers, the gateway and every caller with it. So:

- at start the soft limit is raised to the hard one (systemd's LimitNOFILE,
  the shell's ulimit -Hn): headroom costs nothing until it is used;
- the count is followed from the monitor events (peers.py), checked as each
  accepted connection is reported, with the rest of the process's
  descriptors counted now and then;
- past WARN_AT of the limit a warning is logged (fd_pressure, rate-limited);
- at REFUSE_AT the public endpoints stop taking new peers: their ipc socket
  files become mode 0, so the kernel refuses a connecting client (its ZeroMQ
  socket retries) before libzmq accepts anything; a connection libzmq still
  accepts (TCP, root, the backlog already queued) is closed as it is
  reported. Connections that never sent a message in MUTE_S are closed,
  then clients silent for QUIET_S, longest silent first, down to
  RESUME_BELOW; one holding a request never is. Unbinding would have closed
  every client at once: libzmq drops an endpoint's connections with it;
- the endpoints take peers again as soon as that is done: under
  RESUME_BELOW, and no connection to them that never sent a message left
  (closed, or gone by itself). Waiting longer would only keep newcomers
  out: while the file is mode 0 nothing tells whether the flood still
  knocks, so taking peers again is how to find out. A flood that comes
  back is met after AGAIN_AFTER more connections, not at REFUSE_AT again,
  and those are shed in turn MUTE_S later: a flood that holds its
  connections gets in at most AGAIN_AFTER of the limit per MUTE_S, and a
  newcomer is served the moment the flood is over.

What a burst may take while the loop notices is the half left free. For a
local user other than root, the mode-0 file stops a flood outright (the
listen backlog, 100, is all that gets past); a flood libzmq keeps accepting,
faster than the loop closes it, can still end in libzmq's abort, which the
raised limit makes hard to reach.
"""
import logging
import os
import resource

from jevany_daemon.logs import RateLimited

log = logging.getLogger("jevany.supervisor")

WARN_AT = 0.4          # of the limit: log fd_pressure
REFUSE_AT = 0.5        # stop taking new peers, close idle ones
RESUME_BELOW = 0.4     # take new peers again, once the flood that was refused is shed
AGAIN_AFTER = 0.05     # after resuming, refuse again once this much more of the limit is taken
MUTE_S = 1.0           # a connection that sent nothing this long may be closed under pressure
QUIET_S = 30.0         # and a client that sent nothing since this long, if that is not enough
CALM_AFTER_S = 60.0    # this long after the last resume with no refusal, back to REFUSE_AT
RECOUNT_EVERY_S = 2.0  # the descriptors that are not peers (workers, sockets, files), counted again
RECOUNT_UP_TO = 65536  # past this many, counting /proc/self/fd costs more than it tells
PRESSURE_LOG_EVERY_S = 10.0


def raise_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = _nr_open()
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass          # kept as it was; the guard works from whatever the limit is
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def open_count() -> int:
    """Descriptors this process holds now (the listing's own one not counted)."""
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(where)) - 1
        except OSError:
            continue
    return 0


class FdGuard:
    """Turns new peers away, and idle ones out, near the limit; checked as connections come and each turn.

    listeners: objects with stop() and resume() (the public endpoints); busy():
    the descriptors of peers holding a request, which are never closed.
    """

    def __init__(self, peers, listeners: list, busy, clock, limit: int | None = None):
        self.peers, self.listeners, self.busy, self.clock = peers, listeners, busy, clock
        self.limit = limit if limit is not None else resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.refuse_at = int(REFUSE_AT * self.limit)
        self.refusing = False
        self.refusals = 0         # times the endpoints stopped taking peers
        self.resumed_at = float("-inf")
        self.others = max(0, open_count() - len(peers))
        self._next_recount = clock() + RECOUNT_EVERY_S
        self.warned = RateLimited(log, "fd_pressure", PRESSURE_LOG_EVERY_S, clock, level=logging.WARNING)
        # A flood that keeps coming back stops and resumes the endpoints about once per MUTE_S.
        self.stops = RateLimited(log, "fd_refusing", PRESSURE_LOG_EVERY_S, clock, level=logging.WARNING)
        self.resumes = RateLimited(log, "fd_resumed", PRESSURE_LOG_EVERY_S, clock)
        self.public = {listener.sock for listener in listeners}
        peers.on_accept = self.accepted

    @property
    def open(self) -> int:
        return self.others + len(self.peers)

    def accepted(self, sock=None) -> bool:
        """A connection was just reported: refuse at once past the threshold, before reading further events;
        True closes a public one while refusing (the control endpoint's owner always gets in)."""
        if not self.refusing and self.open >= self.refuse_at:
            self._refuse()
        return self.refusing and sock in self.public

    def check(self) -> None:
        """Once a turn, after the monitor events are read: integer sums unless something must be done."""
        now = self.clock()
        self.calm()
        if now >= self._next_recount:
            self._next_recount = now + RECOUNT_EVERY_S
            if self.open < RECOUNT_UP_TO:
                self.others = max(0, open_count() - len(self.peers))
        if self.open >= WARN_AT * self.limit:
            self.warned.hit(open=self.open, limit=self.limit, peers=len(self.peers),
                            refusing="yes" if self.refusing else "no")
        self.accepted()
        if self.refusing:
            self._shed()
            if self.open < RESUME_BELOW * self.limit and not self._unheard():
                self._resume(now)
        self.warned.flush()
        self.stops.flush()
        self.resumes.flush()

    def _refuse(self) -> None:
        self.refusing, self.refusals = True, self.refusals + 1
        for listener in self.listeners:
            listener.stop()
        self.stops.hit(open=self.open, limit=self.limit, peers=len(self.peers))

    def _resume(self, now: float) -> None:
        self.refusing, self.resumed_at = False, now
        # A flood that was waiting comes straight back: meet it after a few more, not at REFUSE_AT.
        self.refuse_at = min(int(REFUSE_AT * self.limit), self.open + max(1, int(AGAIN_AFTER * self.limit)))
        for listener in self.listeners:
            listener.resume()
        self.resumes.hit(open=self.open, limit=self.limit, peers=len(self.peers))

    def _unheard(self) -> bool:
        """Whether a connection to a public endpoint that never sent a message still holds its descriptor
        (one closed, or turned away, counts until libzmq reports it gone): the flood is not over."""
        return any(not c.heard and c.sock in self.public for c in self.peers.conns.values())

    def _shed(self) -> None:
        excess = self.open - int(RESUME_BELOW * self.limit) + 1
        closing = sum(c.closing for c in self.peers.conns.values())
        victims = self.peers.idlest(max(0, excess - closing), MUTE_S, QUIET_S, self.busy())
        if victims:
            self.peers.shed(victims)

    def calm(self) -> None:
        """Back to the full threshold once no flood came for a while (called each turn)."""
        if not self.refusing and self.clock() - self.resumed_at >= CALM_AFTER_S:
            self.refuse_at = int(REFUSE_AT * self.limit)

    def describe(self) -> dict:
        return {"open": self.open, "limit": self.limit, "refusing_new_peers": self.refusing,
                "refusals": self.refusals, **self.peers.describe()}
