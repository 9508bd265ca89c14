"""POST /v1/systemone/bulk and AsyncJevClient.decide_stream: many items in one call, answers as they finish.

An embedded app for the shapes and the refusals; a real daemon (its gateway
process, loopback only) for thousands of items in one call and for the
ZeroMQ counterpart.
"""
import asyncio
import json
import socket
import threading
import time

import pytest

from jevany_client import AsyncJevClient
from jevany_client.errors import InvalidRequestError
from jevany_daemon.asgi import JevModel, create_app
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine

from .asgi_thread import serving
from .daemons import rss_kb, wait_for
from .http_proc import Http, free_port, healthy

QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"},
             "team": {"type": "choice", "criteria": {"billing": None, "shipping": "parcels"}}}


class Stream:
    """One bulk call over a raw socket: the body sent chunked from a thread, the answer lines read here."""

    def __init__(self, port: int, lines, query: str = "", headers: bytes = b""):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        # A small send buffer (no autotuning), so what was sent is close to what the server has read.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
        self.sock.sendall(b"POST /v1/systemone/bulk" + query.encode() + b" HTTP/1.1\r\nHost: test\r\n"
                          b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n" + headers + b"\r\n")
        self.sent = 0
        self.writer = threading.Thread(target=self._write, args=(lines,), daemon=True)
        self.writer.start()
        self.file = self.sock.makefile("rb")
        self.status = int(self.file.readline().split()[1])
        self.headers = {}
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            self.headers[name.lower()] = value.strip()

    def _write(self, lines) -> None:
        try:
            for line in lines:
                data = (line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n"
                self.sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))
                self.sent += 1
            self.sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass           # the server stopped reading (too many items) and closed

    def lines(self):
        """The response's JSON lines, as they come (chunked framing taken off)."""
        pending = b""
        while True:
            size = int(self.file.readline().strip() or b"0", 16)
            if size == 0:
                return
            pending += self.file.read(size)
            self.file.readline()
            *whole, pending = pending.split(b"\n")
            for line in whole:
                yield json.loads(line)

    def close(self) -> None:
        # shutdown first: close() alone leaves the connection open while the writer thread is blocked
        # sending on it (the server not reading yet), and the server would never see the client go
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass        # already gone
        self.file.close()
        self.sock.close()
        self.writer.join(30)


@pytest.fixture(scope="module")
def app_port(loaded_model):
    model = JevModel(Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8)))
    with serving(create_app(model=model, max_message_bytes=4096)) as port:
        yield port


def test_each_item_gets_its_own_answer_or_error_then_a_closing_line(app_port):
    items = [{"questions": QUESTIONS}, {"model": "jev-latest"}]              # shared by the lines after them
    items += [{"id": f"ticket-{i}", "state": f"parcel {i} is late"} for i in range(20)]
    items += [b"not json", {"state": "x", "questions": {"q": {"type": "choice", "criteria": "none"}}},
              b"x" * 5000, {"id": 7, "state": "own questions", "questions": {"u": {"type": "noul"}}},
              {"state": "a box", "questions": {"b": {"type": "box"}}}, b"", b"[1, 2]",
              {"state": "an image", "assets": {"p": {"type": "image", "part": "asset-0"}}}]
    stream = Stream(app_port, items, "?in_flight=4")
    assert stream.status == 200 and stream.headers["content-type"] == "application/x-ndjson"
    got = list(stream.lines())
    stream.close()
    *answers, closing = got
    assert closing == {"done": True, "items": 27, "answered": 21, "failed": 6}
    by_index = {line["index"]: line for line in answers}
    assert sorted(by_index) == list(range(27)) and len(answers) == 27
    http = Http(app_port)
    for i in range(20):
        line = by_index[i]
        assert line["id"] == f"ticket-{i}"
        status, _, alone = http.request("POST", "/v1/systemone", {"state": f"parcel {i} is late", "questions": QUESTIONS})
        assert status == 200 and _same(line["answer"]["answers"], alone["answers"])
    http.close()
    assert "not JSON" in by_index[20]["error"]["message"] and by_index[20]["error"]["status"] == 422
    assert by_index[21]["error"]["code"] == "invalid_request" and "criteria" in by_index[21]["error"]["message"]
    assert "longer than 4,096 bytes" in by_index[22]["error"]["message"]
    assert by_index[23]["id"] == 7 and by_index[23]["answer"]["answers"]["u"]["type"] == "noul"
    assert "box question" in by_index[24]["error"]["message"]
    assert "each line is a JSON object" in by_index[25]["error"]["message"]
    assert "multipart/form-data" in by_index[26]["error"]["message"]


def test_bulk_refusals_before_the_stream(app_port):
    http = Http(app_port)
    status, headers, reply = http.request("POST", "/v1/systemone/bulk?in_flight=0", raw=b"")
    assert status == 422
    status, _, reply = http.request("POST", "/v1/systemone/bulk", raw=b"{}", headers={"Content-Encoding": "zstd"})
    assert status == 415 and "uncompressed" in reply["detail"]
    http.close()
    stream = Stream(app_port, [{"state": "x"}])             # no questions anywhere
    [line, closing] = list(stream.lines())
    stream.close()
    assert line["error"]["code"] == "invalid_request" and closing["failed"] == 1


def test_thousands_of_items_in_one_call_through_the_daemon(start_daemon):
    # benchmarks/bulk_bench.py runs the same with 10,000 items and reports its figures.
    port = free_port()
    daemon = start_daemon("--http", f"127.0.0.1:{port}", "--max-batch-size", "32", readout="choice")
    wait_for(lambda: healthy(port), 60, "the gateway answering /health")
    gateway = daemon.status()["http"]["pid"]
    before = rss_kb(gateway)
    total = 4000
    # 4 kB of padding a line (a field the route ignores): 16 MB in all, more than the socket buffers
    # between the two could hold, so an answer read before the last line was sent was sent before
    # the gateway read it.
    items = ({"id": i, "padding": " " * 4096, "state": f"order {i}: the parcel is late", "questions": QUESTIONS}
             for i in range(total))
    stream = Stream(port, items, "?in_flight=32")
    seen, first_at, peak = set(), None, before
    for line in stream.lines():
        if "done" in line:
            closing = line
            break
        if first_at is None:
            first_at = stream.sent
        assert "answer" in line, line
        assert line["id"] == line["index"] and line["index"] not in seen
        seen.add(line["index"])
        if len(seen) % 1000 == 0:
            peak = max(peak, rss_kb(gateway))
    stream.close()
    assert closing == {"done": True, "items": total, "answered": total, "failed": 0}
    assert seen == set(range(total))
    assert first_at < total, "the first answer came only after the last item was sent"
    assert peak - before < 100 * 1024, f"the gateway grew {peak - before} kB"


def test_a_reader_that_stops_reading_holds_no_worker(start_daemon):
    port = free_port()
    daemon = start_daemon("--http", f"127.0.0.1:{port}", "--max-batch-size", "32", readout="choice")
    wait_for(lambda: healthy(port), 60, "the gateway answering /health")
    # A 4 kB id, echoed in each answer: 5,000 answers (20 MB) are more than the kernel's buffers between
    # the two can hold, so the gateway must stop reading while nobody reads what it writes.
    big = {"id": "i" * 4096, "state": "a long state " * 200, "questions": QUESTIONS}
    stream = Stream(port, (big for _ in range(5000)), "?in_flight=64")   # and never reads its answers
    wait_for(lambda: stream.sent > 100, 60, "the bulk body flowing")
    with daemon.client(timeout=30) as client:
        started = time.monotonic()
        for _ in range(5):
            client.decide("is this answered meanwhile?", QUESTIONS)
        took = time.monotonic() - started
    assert took < 20, f"five requests beside a stalled bulk reader took {took:.1f}s"
    sent = stream.sent
    assert sent < 5000, "the gateway read the whole body though nobody read its answers"
    stream.close()


def test_decide_stream_over_zeromq(start_daemon):
    daemon = start_daemon("--max-batch-size", "32", readout="choice")
    read = []

    def bodies():
        for i in range(2000):
            read.append(i)
            yield {"state": f"order {i}", "questions": QUESTIONS} if i != 5 else {"state": "x", "questions": {}}

    async def scenario():
        async with AsyncJevClient(daemon.endpoint, timeout=60) as client:
            first_at, got = None, {}
            async for index, outcome in client.decide_stream(bodies(), in_flight=16):
                if first_at is None:
                    first_at = len(read)
                assert index not in got
                got[index] = outcome
            return first_at, got

    first_at, got = asyncio.run(scenario())
    assert sorted(got) == list(range(2000)) and first_at < 2000
    assert isinstance(got[5], InvalidRequestError)
    assert all(set(got[i]["answers"]) == set(QUESTIONS) for i in got if i != 5)


def _same(a: dict, b: dict) -> bool:
    """The same answers, probabilities within the batched-equals-serial bound."""
    return a.keys() == b.keys() and all(
        a[q].get("choice") == b[q].get("choice")
        and all(abs(p - b[q]["probabilities"][k]) <= 1e-5 for k, p in a[q].get("probabilities", {}).items())
        and abs(a[q].get("noul", 0) - b[q].get("noul", 0)) <= 0.01 for q in a)


class Upstream:
    """A daemon stand-in for the gateway's routes: ready, each decide taking `seconds`, counted."""

    def __init__(self, seconds: float = 0.0, fail: bool = False):
        self.seconds, self.fail, self.decides = seconds, fail, 0

    def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def call(self, op: str, body=None, timeout_ms=None, wait_s=30.0) -> dict:
        if op == "status":
            return {"state": "ready"}
        self.decides += 1
        await asyncio.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("a fault of the gateway's")
        return {"model": "stand-in", "answers": {"u": {"type": "noul", "noul": 0.5,
                                                       "probabilities": {"false": 0.5, "true": 0.5}}},
                "usage": {"input_tokens": 1, "output_tokens": 1}, "latency_ms": 1.0}


def _routes(upstream, max_bytes: int = 4096):
    from jevany_daemon.gateway.app import Gateway, create_app as routes

    return routes(Gateway(upstream, {"max_message_bytes": max_bytes}, None, None))


ITEM = {"state": "s", "questions": {"u": {"type": "noul"}}}


def test_a_line_nested_past_the_parser_is_its_own_error(app_port):
    deep = b'{"state": ' + b"[" * 1500 + b"]" * 1500 + b', "questions": {"u": {"type": "noul"}}}'     # within the line cap
    stream = Stream(app_port, [{"state": "before", "questions": QUESTIONS}, deep, {"state": "after", "questions": QUESTIONS}])
    *lines, closing = list(stream.lines())
    stream.close()
    assert closing == {"done": True, "items": 3, "answered": 2, "failed": 1}
    assert "nests deeper" in {line["index"]: line for line in lines}[1]["error"]["message"]


def test_a_stalled_body_ends_the_call_once_its_items_are_answered(monkeypatch):
    from jevany_daemon.gateway import bulk

    monkeypatch.setattr(bulk, "STALL_S", 1.0)
    upstream = Upstream(seconds=2.0)       # each item slower than the stall bound: the route is not waiting then
    with serving(_routes(upstream)) as port:
        gate = threading.Event()

        def lines():
            yield ITEM
            yield ITEM
            gate.wait(60)                  # then the body sends nothing more until the test ends

        stream = Stream(port, lines(), "?in_flight=1")
        *answers, closing = list(stream.lines())
        gate.set()
        stream.close()
    assert sorted(line["index"] for line in answers) == [0, 1] and all("answer" in line for line in answers)
    assert closing["done"] is False and "sent nothing" in closing["error"]["message"] and closing["answered"] == 2


def test_a_client_that_goes_away_stops_its_items_being_sent():
    upstream = Upstream(seconds=0.05)
    with serving(_routes(upstream, max_bytes=1 << 20)) as port:
        stream = Stream(port, [ITEM] * 500, "?in_flight=2")
        next(stream.lines())               # the body is in, an answer out: then the client goes
        stream.close()

        def settled():
            before = upstream.decides
            time.sleep(0.3)                # watching a counter for a change, bounded by wait_for
            return upstream.decides == before

        wait_for(settled, 30, "the stand-in's decides to stop")
    assert upstream.decides < 50, f"{upstream.decides} of 500 items were sent after their client went away"


def test_a_fault_in_a_route_is_a_500_in_its_contract_s_shape_with_a_request_id():
    with serving(_routes(Upstream(fail=True))) as port:
        http = Http(port)
        status, headers, reply = http.request("POST", "/v1/systemone", ITEM)
        assert status == 500 and headers["x-typesafe-request-id"] and isinstance(reply["detail"], str)
        decisions = {"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "x"}]}
        status, headers, reply = http.request("POST", "/v1/decisions", decisions)
        assert status == 500 and headers["x-typesafe-request-id"] and reply["error"]["type"] == "server_error"
        http.close()
