"""Who is connected to each client socket, as libzmq's monitor tells it, read from the loop.

libzmq accepts and drops connections in its own thread and never says which
connection a message came on, but it does say (monitor events) when it
accepts one and when one goes, each with its file descriptor, and a received
message carries the descriptor it came on (ZMQ_SRCFD). From those the loop
knows:

- how many descriptors clients hold, so a flood of connections can be met
  before the process runs out (fds.py);
- which peers have been idle longest, to close first under that pressure;
- which connection a request came on, so its reply goes back only while that
  same connection lives: a routing id is only a name, and a newcomer that
  takes a departed client's explicit id must not receive what was meant for
  it (on CurveZMQ the connection is the authenticated key's);
- who the peer is: the uid of an ipc peer (SO_PEERCRED, in libzmq's
  Peer-Address), the client key of a CurveZMQ one (ZAP's User-Id).

Events are read after a message is received and before its connection is
looked up, and before any reply is sent; libzmq emits them from its I/O
thread before the later steps of the same connection happen, so the loop
never judges on stale events. Reading them only when a descriptor is unknown
would not do: the kernel gives a departed connection's descriptor to the
next one, so the one a message came on may be new and still look like the
old one (its reply then went nowhere, as if its client had gone). Sockets
are watched together and descriptors are the process's, so a connection
gone from one socket is only forgotten if it was that socket's. The other
way round, a departed connection's pipe may still hold a message when a
newcomer has its descriptor; libzmq stamps every message with its sender
(Peer-Address: an ipc peer's uid, gid and pid, a TCP peer's address), so a
message whose sender is not the descriptor's holder is tied to no
connection, and its reply goes nowhere rather than to the newcomer.
"""
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass, field
from itertools import count

import zmq
from zmq.utils.monitor import parse_monitor_message

from jevany_client.calls import has_message

from jevany_daemon.tenants import salt

_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


@dataclass(eq=False)
class Conn:
    """One accepted connection: its descriptor, and when it was last heard from."""
    fd: int
    serial: int            # unique per connection, though the kernel reuses descriptor numbers
    since: float
    seen: float
    closing: bool = False  # shut down by us under descriptor pressure; libzmq will report it gone
    heard: bool = False    # it has sent a message: a client, not only a connection
    who: dict = field(default_factory=dict)   # cached identity: uid, tenant
    sock: object = None    # the socket that accepted it
    holder: object = None  # who is at the other end of its descriptor (_holder), learnt at its first message


@dataclass(frozen=True)
class Peer:
    """Where a request came from, carried with it until its reply."""
    fd: int | None         # None: a socket not watched (the gateway's, ours)
    serial: int | None
    uid: int | None = None          # an ipc peer's, from SO_PEERCRED
    tenant: str | None = None       # the prefix-cache namespace its requests use (tenants.py)


UNWATCHED = Peer(None, None)
DEPARTED = 0     # the serial of a message from a connection that is gone: no connection has it (they count from 1)


class Peers:
    def __init__(self, poller, clock):
        self.poller, self.clock = poller, clock
        self.monitors: dict = {}          # monitor socket → the ROUTER it watches
        self.conns: dict[int, Conn] = {}  # fd → the connection holding it now
        self.left: set[int] = set()       # fds a connection has departed from (bounded by the fd limit)
        self._serials = count(1)
        self.accepted = self.gone = self.closed_by_us = self.turned_away = 0
        # Asked of each connection as it is reported, with the socket it came on: True closes it at
        # once (fds.py, while descriptors run short).
        self.on_accept = lambda sock: False

    def watch(self, sock) -> None:
        monitor = sock.get_monitor_socket(_EVENTS)
        self.monitors[monitor] = sock
        self.poller.register(monitor, zmq.POLLIN)

    def __len__(self) -> int:
        return len(self.conns)

    def read(self) -> None:
        """Take every monitor event waiting; cheap when there is none."""
        for monitor, sock in self.monitors.items():
            while has_message(monitor):
                self._event(sock, parse_monitor_message(monitor.recv_multipart()))

    def _event(self, sock, message: dict) -> None:
        fd, now = int(message["value"]), self.clock()
        if message["event"] == zmq.EVENT_ACCEPTED:
            self.accepted += 1
            if fd in self.conns:
                self.gone += 1     # another socket's, whose departure is read after this: it is gone
            conn = self.conns[fd] = Conn(fd, next(self._serials), now, now, sock=sock)
            if self.on_accept(sock):
                self.close([conn])
                self.turned_away += 1
        elif fd in self.conns and self.conns[fd].sock is sock:
            # Another socket's connection may hold the descriptor now: its accept was read first.
            del self.conns[fd]
            self.left.add(fd)
            self.gone += 1

    def came_from(self, frame, identify) -> Peer:
        """The connection a received frame came on, noted as active; identify(frame) → (uid, tenant) once per
        connection."""
        fd = frame.get(zmq.SRCFD)
        self.read()        # its connection's accept, and any departure of a former holder of its descriptor
        conn = self.conns.get(fd)
        if conn is None:
            # Who sent it is the frame's own metadata, so its requests still get their tenant: a cache
            # namespace never depends on the monitor's timing.
            uid, tenant = identify(frame)
            if fd in self.left:
                # Came and went before its message was read (a client that sends and closes at once):
                # its accept and its departure were both read just now. Nobody is left to answer.
                return Peer(fd, DEPARTED, uid, tenant)
            return Peer(fd, None, uid, tenant)     # not reported (yet): replies go, unbound
        if conn.holder is None:
            conn.holder = _holder(fd)
        if not _may_be(frame, conn.holder):
            # A departed connection's last words, read after a newcomer took its descriptor (its pipe
            # still held them): tied to no connection, so the newcomer never gets their reply.
            uid, tenant = identify(frame)
            return Peer(fd, DEPARTED, uid, tenant)
        conn.seen, conn.heard = self.clock(), True
        if not conn.who:
            uid, tenant = identify(frame)
            conn.who = {"uid": uid, "tenant": tenant}
        return Peer(fd, conn.serial, conn.who["uid"], conn.who["tenant"])

    def alive(self, peer: Peer) -> bool:
        """Whether the connection a request came on still holds its descriptor (read() first), and is not
        being closed by us."""
        if peer.serial is None:
            return True
        conn = self.conns.get(peer.fd)
        return conn is not None and conn.serial == peer.serial and not conn.closing

    def shed(self, conns: list[Conn]) -> None:
        """Close idle connections to free their descriptors."""
        self.close(conns)
        self.closed_by_us += len(conns)

    def idlest(self, n: int, mute_s: float, quiet_s: float, busy: set) -> list[Conn]:
        """Connections to close for their descriptors, holding no request: every one that never sent a
        message in mute_s, then up to n more silent for quiet_s, longest silent first."""
        now = self.clock()
        open_ = [c for c in self.conns.values() if not c.closing and c.fd not in busy]
        mute = [c for c in open_ if not c.heard and now - c.seen >= mute_s]
        quiet = sorted((c for c in open_ if c.heard and now - c.seen >= quiet_s), key=lambda c: c.seen)
        return mute + quiet[:max(0, n - len(mute))]

    def close(self, conns: list[Conn]) -> None:
        """Shut these connections down; libzmq sees the end, closes the descriptor and reports it gone.

        shutdown(), never close(): the descriptor stays libzmq's to close, so it is
        never freed under its feet or reused while it still means this connection.
        """
        for conn in conns:
            conn.closing = True
            try:
                sock = socket.socket(fileno=conn.fd)
            except OSError:
                continue   # libzmq closed it already; its event is on the way
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass       # already gone
            finally:
                sock.detach()

    def describe(self) -> dict:
        return {"connected": len(self.conns), "accepted": self.accepted, "gone": self.gone,
                "closed_idle": self.closed_by_us, "turned_away": self.turned_away}

    def close_monitors(self) -> None:
        for monitor, sock in self.monitors.items():
            self.poller.unregister(monitor)
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            monitor.close(linger=0)
        self.monitors.clear()


def _holder(fd: int) -> tuple | None:
    """Who holds a connected descriptor now, as a message's Peer-Address names its sender: an ipc peer's
    (uid, gid, pid) by SO_PEERCRED, a TCP peer's address; None if it cannot be told (gone already)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.family == socket.AF_UNIX:
            pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                struct.calcsize("3i")))
            return ("ipc", uid, gid, pid)
        return ("tcp", ipaddress.ip_address(sock.getpeername()[0].split("%")[0]))
    except (OSError, ValueError):
        return None
    finally:
        sock.detach()


def _may_be(frame, holder: tuple | None) -> bool:
    """Whether a message may have come from its descriptor's holder: false only when its Peer-Address
    (libzmq's, per message: 'host:uid:gid:pid' on ipc, the address on TCP) names someone else."""
    address = _peer_address(frame) if holder is not None else None
    if address is None:
        return True
    if holder[0] == "ipc":
        sender = _ipc_credentials(address)
        return sender is None or sender == holder[1:]
    try:
        return ipaddress.ip_address(address.strip("[]").split("%")[0]) == holder[1]
    except ValueError:
        return True


def _peer_address(frame) -> str | None:
    try:
        return frame.get("Peer-Address")
    except zmq.ZMQError:
        return None


def _ipc_credentials(address: str) -> tuple[int, int, int] | None:
    """(uid, gid, pid) from an ipc peer's Peer-Address: libzmq appends ':uid:gid:pid' (SO_PEERCRED)."""
    parts = address.split(":")
    if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
        return None         # TCP: an address (IPv6 ones have more colons), no credentials
    return int(parts[1]), int(parts[2]), int(parts[3])


def ipc_uid(frame) -> int | None:
    """The peer's uid on an ipc connection, from its Peer-Address."""
    address = _peer_address(frame)
    credentials = None if address is None else _ipc_credentials(address)
    return None if credentials is None else credentials[0]


def curve_key(frame) -> str | None:
    """The z85 public key a CurveZMQ peer authenticated with (the ZAP handler's User-Id)."""
    try:
        return frame.get("User-Id") or None
    except zmq.ZMQError:
        return None


def identify(frame) -> tuple[int | None, str | None]:
    """(uid, tenant) of the connection a message came on; computed once per connection (tenants.py)."""
    key = curve_key(frame)
    uid = ipc_uid(frame)
    if key is not None:
        return uid, salt("curve", key)
    if uid is not None:
        return uid, salt("uid", str(uid))
    return None, None


def may_control(envelope) -> bool:
    """Whether a control op's sender may act: its uid, where the transport tells one, must be ours.

    The control socket's file mode already keeps other users out; this holds
    wherever a file mode cannot (a socket reached some other way), and costs
    a comparison.
    """
    uid = getattr(envelope, "peer", UNWATCHED).uid
    return uid is None or is_trusted_uid(uid)


def is_trusted_uid(uid: int | None) -> bool:
    """A control peer may act when it is this process's user (or root); an unknown uid is not trusted."""
    return uid is not None and uid in (os.getuid(), 0)
