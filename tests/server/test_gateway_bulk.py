"""A bulk call's body read as JSON lines (gateway/bulk.py), driven in process with a stand-in decide."""
import asyncio
import json

import pytest

from jevany_daemon.gateway import bulk
from jevany_daemon.gateway.bulk import BulkStream

NOUL = {"q": {"type": "noul"}}
SCORE = {"s": {"type": "score", "criteria": ["lo", "hi"]}}


def _call(lines: list[bytes], max_line: int = 1 << 20, chunk: int | None = None, end: bytes = b"\n",
          stalls: bool = False):
    """(the decide bodies sent, the response's lines) for a body of `lines`, sent `chunk` bytes a message, the
    last line followed by `end`; a body that stalls says more is coming after its last message, and sends none."""
    body = b"\n".join(lines) + end
    step = chunk or max(len(body), 1)
    messages = [{"type": "http.request", "body": body[i:i + step], "more_body": stalls or i + step < len(body)}
                for i in range(0, max(len(body), 1), step)]
    decided, sent = [], []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()      # the client stays, sending nothing more

    async def send(message):
        sent.append(message)

    async def decide(item):
        decided.append(item)
        return {"model": item["model"], "answers": {}, "usage": {}, "latency_ms": 0}

    asyncio.run(asyncio.wait_for(BulkStream(decide, "jevany", max_line, 1)({}, receive, send), 30))
    return decided, [json.loads(m["body"]) for m in sent[1:]]


def test_shared_lines_add_up_and_an_item_s_own_fields_win():
    decided, out = _call([json.dumps({"questions": NOUL}).encode(), json.dumps({"model": "m2"}).encode(),
                          json.dumps({"id": "a", "state": "s1"}).encode(),
                          json.dumps({"state": "s2", "questions": SCORE}).encode()])
    assert [(d["state"], list(d["questions"]), d["model"]) for d in decided] == [("s1", ["q"], "m2"),
                                                                                ("s2", ["s"], "m2")]
    assert out[0] == {"index": 0, "id": "a", "answer": {"model": "m2", "answers": {}, "usage": {}, "latency_ms": 0}}
    assert out[-1] == {"done": True, "items": 2, "answered": 2, "failed": 0}


def _line(size: int) -> bytes:
    bare = json.dumps({"questions": NOUL, "state": ""}).encode()
    return json.dumps({"questions": NOUL, "state": "x" * (size - len(bare))}).encode()


@pytest.mark.parametrize("chunk", [None, 1])
def test_a_line_of_exactly_the_limit_is_an_item_and_one_byte_longer_is_its_own_error(chunk):
    limit = 120
    decided, out = _call([_line(limit), _line(limit + 1), _line(limit)], max_line=limit, chunk=chunk)
    assert len(_line(limit)) == limit and len(decided) == 2
    errors = [line for line in out if "error" in line]
    assert [line["index"] for line in errors] == [1] and "longer than" in errors[0]["error"]["message"]
    assert out[-1] == {"done": True, "items": 3, "answered": 2, "failed": 1}


def test_a_call_of_exactly_max_lines_is_done_and_one_line_more_stops_it(monkeypatch):
    monkeypatch.setattr(bulk, "MAX_LINES", 3)
    item = json.dumps({"questions": NOUL, "state": "s"}).encode()
    assert _call([item] * 3)[1][-1] == {"done": True, "items": 3, "answered": 3, "failed": 0}
    decided, out = _call([item] * 4)
    assert (len(decided), out[-1]["done"], out[-1]["error"]["status"]) == (3, False, 413)


@pytest.mark.parametrize("chunk", [None, 1])
def test_the_last_line_without_its_newline_is_still_an_item(chunk):
    item = json.dumps({"questions": NOUL, "state": "s"}).encode()
    decided, out = _call([item, item.replace(b'"s"', b'"last"')], chunk=chunk, end=b"")
    assert [d["state"] for d in decided] == ["s", "last"]
    assert out[-1] == {"done": True, "items": 2, "answered": 2, "failed": 0}


def test_a_body_that_sends_nothing_for_stall_s_ends_the_call_and_its_unfinished_line_is_no_item(monkeypatch):
    # The stall is the thing tested: STALL_S made short, the body then sends nothing more (nor its end).
    monkeypatch.setattr(bulk, "STALL_S", 0.2)
    item = json.dumps({"questions": NOUL, "state": "s"}).encode()
    decided, out = _call([item, item, b'{"questions": {"q": {"type": "noul"}}, "sta'], end=b"", stalls=True)
    assert len(decided) == 2
    assert out[-1]["done"] is False and "sent nothing for 0.2 s" in out[-1]["error"]["message"]
    assert (out[-1]["items"], out[-1]["answered"]) == (2, 2)
