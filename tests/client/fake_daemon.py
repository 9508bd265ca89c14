"""A stand-in jevany daemon for client tests: real ROUTER sockets, canned answers.

    python tests/client/fake_daemon.py ENDPOINT [ENDPOINT ...] [--control E] [--name N]

`decide` answers by the body's state:
  "error:CODE"                 the error reply for CODE (unknown codes too)
  "slow"                       the echo, 1 s late
  {"delay": S, ...}            the echo, S seconds late
  {"group": G, "size": N, ...} held until N requests of group G arrived, then
                               all answered newest first ("oldest_first": true:
                               in arrival order); status "held" counts them
  anything else                the echo, at once
Late replies wait in a heap of due times and the poll timeout is the time to
the next one, so one slow request never holds up the others. Every reply
result carries "order": how many replies this daemon had sent before it, and
a decide result "peer": the hex ROUTER identity of the socket that sent it.
A control op whose body is {"error": CODE} gets the error reply for CODE.
More `decide` states:
  {"record": K, "error": CODE} the error reply for CODE; the arrival time is
                               kept, and status "arrivals" lists them by K
  {"duplicate_after": S, ...}  the echo at once, and the same reply again S
                               seconds later
  {"keep_on": NAME, ...}       never answered by the daemon named NAME (status
                               "kept" counts them), the echo at once elsewhere
  {"refuse_on": NAME, "error": CODE, ...}
                               the error reply for CODE from the daemon named
                               NAME, the echo at once elsewhere
  {"record": K, "drop": true}  never answered: the arrival time is kept (status
                               "arrivals"), and the socket it came in on is
                               closed and bound again, so every connection to
                               that endpoint drops and clients reconnect
A control op whose body is {"record": K, "drop": true} does the same.
With --load Q every decide reply carries the load {"queue": Q, "inflight": 0}
(PROTOCOL.md); status "decided" counts the decide requests received. With
--state S its status says state S (default "ready").
A ping's result names the daemon ("server"), so a client on several
endpoints can tell which ones it has reached.
"""

import argparse
import heapq
import itertools
import os
import time

import zmq

from jevany_client.errors import ERROR_CLASSES, ForbiddenError, JevanyError
from jevany_client.protocol import CONTROL_OPS, decode_request, error_reply, ok_reply, pack

SLOW_S = 1.0


class FakeDaemon:
    def __init__(self, public: list[str], control: str | None, name: str, load: int | None = None,
                 state: str = "ready") -> None:
        self.name = name
        self.state = state
        self.load = load
        self.decided = 0
        self.started = time.monotonic()
        self.context = zmq.Context()
        self.control_sockets = set()
        self.bound: dict = {}       # socket -> its endpoint
        self.poller = zmq.Poller()
        self.endpoints = [self._bind(e) for e in public]
        if control is not None:
            self._bind(control, is_control=True)
        self.due: list = []  # (due time, tie, socket, envelope, id, result)
        self.tie = itertools.count()
        self.groups: dict = {}
        self.sent = 0
        self.ok = 0
        self.errors: dict[str, int] = {}
        self.arrivals: dict[str, list[float]] = {}   # recorded requests' arrival times, by key
        self.kept = 0

    def _bind(self, endpoint: str, is_control: bool = False) -> str:
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint)
        self.poller.register(sock, zmq.POLLIN)
        self.bound[sock] = endpoint
        if is_control:
            self.control_sockets.add(sock)
        return endpoint

    def drop_connections(self, sock: zmq.Socket) -> None:
        """Close the socket and bind its ipc endpoint again: its connections drop, and clients reconnect."""
        endpoint, is_control = self.bound.pop(sock), sock in self.control_sockets
        self.control_sockets.discard(sock)
        self.poller.unregister(sock)
        sock.close(linger=0)
        # ZeroMQ leaves a named ipc socket's file behind as it closes, and a bind replaces the file.
        self._bind(endpoint, is_control)

    def dropped(self, sock: zmq.Socket, asked) -> bool:
        """{"record": K, "drop": true}: its arrival kept, no answer, the connections dropped."""
        if not (isinstance(asked, dict) and asked.get("drop") is True and "record" in asked):
            return False
        self.arrivals.setdefault(asked["record"], []).append(time.monotonic())
        self.drop_connections(sock)
        return True

    def run(self) -> None:
        while True:
            self.send_due()
            for sock, _ in self.poller.poll(self.poll_ms()):
                self.drain(sock)

    def poll_ms(self) -> int | None:
        if not self.due:
            return None
        return max(0, int((self.due[0][0] - time.monotonic()) * 1000) + 1)

    def send_due(self) -> None:
        while self.due and self.due[0][0] <= time.monotonic():
            _, _, sock, envelope, rid, result = heapq.heappop(self.due)
            if not sock.closed:          # its connections dropped meanwhile: the reply is lost with them
                self.reply_ok(sock, envelope, rid, result)

    def drain(self, sock: zmq.Socket) -> None:
        while not sock.closed:       # a request may have dropped its connections
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # Everything before the payload (identity, REQ's empty delimiter) is echoed.
            self.handle(sock, frames[:-1], frames[-1])

    def handle(self, sock: zmq.Socket, envelope: list, payload: bytes) -> None:
        try:
            request = decode_request(payload)
        except JevanyError as err:
            return self.reply_error(sock, envelope, err.request_id, err)
        if request.op in CONTROL_OPS and sock not in self.control_sockets:
            err = ForbiddenError(f"{request.op} is a control op")
            return self.reply_error(sock, envelope, request.id, err)
        handler = getattr(self, f"op_{request.op}")
        handler(sock, envelope, request)

    def send(self, sock: zmq.Socket, envelope: list, reply: dict) -> None:
        sock.send_multipart([*envelope, pack(reply)])
        self.sent += 1

    def reply_ok(self, sock: zmq.Socket, envelope: list, rid, result: dict) -> None:
        self.ok += 1
        self.send(sock, envelope, self.loaded(ok_reply(rid, {**result, "order": self.sent}), result))

    def reply_error(self, sock: zmq.Socket, envelope: list, rid, err: JevanyError) -> None:
        self.errors[err.code] = self.errors.get(err.code, 0) + 1
        self.send(sock, envelope, self.loaded(error_reply(rid, err), {"answers": None}))

    def loaded(self, reply: dict, result: dict) -> dict:
        if self.load is not None and "answers" in result:      # decide replies only, as the daemon
            reply["load"] = {"queue": self.load, "inflight": 0}
        return reply

    def op_ping(self, sock, envelope, request) -> None:
        self.reply_ok(sock, envelope, request.id, {"pong": True, "version": "test", "server": self.name})

    def op_status(self, sock, envelope, request) -> None:
        self.reply_ok(sock, envelope, request.id, self.status())

    def op_models(self, sock, envelope, request) -> None:
        model = {"id": "fake-tiny", "alias": "jevany-latest", "source": "/models/fake-tiny",
                 "readout": "choice", "layout": "rows", "context_window": 4096,
                 "limits": {"max_input_tokens": 4096}, "prefix_cache": {"hits": 0, "misses": 0}}
        self.reply_ok(sock, envelope, request.id, {"models": [model]})

    def op_clear_cache(self, sock, envelope, request) -> None:
        if self.dropped(sock, request.body):
            return
        code = (request.body or {}).get("error")
        if code is not None:
            return self.reply_error(sock, envelope, request.id, fake_error(code))
        result = {"op": request.op, "server": self.name}
        settle = float(os.environ.get("FAKE_SETTLE_S", "0")) if request.op in ("drain", "reload") else 0
        if settle:      # a reload loading its workers, a drain answering what is in flight
            heapq.heappush(self.due, (time.monotonic() + settle, next(self.tie), sock, envelope, request.id, result))
        else:
            self.reply_ok(sock, envelope, request.id, result)

    op_drain = op_reload = op_clear_cache

    def op_decide(self, sock, envelope, request) -> None:
        state = request.body.get("state")
        rid = request.id
        self.decided += 1
        if self.dropped(sock, state):
            return
        if isinstance(state, dict) and state.get("refuse_on") == self.name:
            return self.reply_error(sock, envelope, rid, fake_error(state["error"]))
        if isinstance(state, dict) and "record" in state:
            self.arrivals.setdefault(state["record"], []).append(time.monotonic())
            return self.reply_error(sock, envelope, rid, fake_error(state["error"]))
        if isinstance(state, str) and state.startswith("error:"):
            return self.reply_error(sock, envelope, rid, fake_error(state[len("error:"):]))
        result = {"model": "fake-tiny", "answers": {}, "latency_ms": 0.0,
                  "usage": {"input_tokens": 0, "output_tokens": 0},
                  "batch": {"size": 1, "padded_tokens": 0},
                  "state": state, "questions": request.body.get("questions"), "media": request.body.get("media"),
                  "server": self.name,
                  "pid": os.getpid(), "peer": envelope[0].hex()}
        if isinstance(state, dict) and "group" in state:
            return self.hold(sock, envelope, rid, result, state)
        if isinstance(state, dict) and state.get("keep_on") == self.name:
            self.kept += 1
            return
        if isinstance(state, dict) and "duplicate_after" in state:
            due = time.monotonic() + state["duplicate_after"]
            heapq.heappush(self.due, (due, next(self.tie), sock, envelope, rid, result))
        delay = state.get("delay", 0) if isinstance(state, dict) else SLOW_S * (state == "slow")
        if delay:
            due = time.monotonic() + delay
            heapq.heappush(self.due, (due, next(self.tie), sock, envelope, rid, result))
        else:
            self.reply_ok(sock, envelope, rid, result)

    def hold(self, sock, envelope, rid, result, state: dict) -> None:
        held = self.groups.setdefault(state["group"], [])
        held.append((sock, envelope, rid, result))
        if len(held) >= state["size"]:
            del self.groups[state["group"]]
            for args in (held if state.get("oldest_first") else reversed(held)):
                self.reply_ok(*args)

    def status(self) -> dict:
        return {
            "version": "test", "pid": os.getpid(), "uptime_s": time.monotonic() - self.started,
            "state": self.state, "endpoints": self.endpoints, "max_message_bytes": 1 << 20,
            "model": {"id": "fake-tiny", "source": "/models/fake-tiny", "readout": "choice",
                      "layout": "rows", "device": "cpu", "dtype": "fp32"},
            "batching": {"max_batch_size": 32, "max_packed_tokens": 8192, "batches": 7,
                         "requests": 12, "mean_batch_size": 12 / 7,
                         "batch_size_histogram": {"1": 4, "2": 1, "10": 2}},
            "queue": {"depth": 3, "max_depth": 1024},
            "workers": [{"pid": os.getpid() + 1, "device": "cpu", "state": "idle",
                         "restarts": 1, "requests": 12,
                         "device_info": {"name": "Fake CPU", "memory_used_bytes": 1 << 29,
                                         "memory_total_bytes": 16 << 30}}],
            "requests": {"ok": self.ok, "error": sum(self.errors.values()),
                         "by_error_code": dict(self.errors)},
            "latency_ms": {"p50": 1.25, "p99": 9.5},
            "server": self.name,
            "held": {group: len(held) for group, held in self.groups.items()},
            "arrivals": self.arrivals,
            "kept": self.kept,
            "decided": self.decided,
        }


def fake_error(code: str) -> JevanyError:
    cls = ERROR_CLASSES.get(code)
    if cls is not None:
        return cls(f"fake {code}")
    return JevanyError(f"fake {code}", code=code, retryable=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoints", nargs="+")
    parser.add_argument("--control")
    parser.add_argument("--name", default="fake")
    parser.add_argument("--load", type=int)
    parser.add_argument("--state", default="ready")
    args = parser.parse_args()
    FakeDaemon(args.endpoints, args.control, args.name, args.load, args.state).run()


if __name__ == "__main__":
    main()
