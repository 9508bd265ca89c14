"""Hostile input on the client library's side: decode costs follow a message's bytes and its
counts are capped; an ipc socket another user could have put in place is refused before anything is sent."""
import os
import threading
import time
import tracemalloc

import msgpack
import pytest
import zmq

from jevany_client import JevClient, JevUnreachableError
from jevany_client.errors import InvalidRequestError
from jevany_client.ipc_trust import ipc_problem
from jevany_client.protocol import MAX_CONTAINERS, MAX_VALUES, decode_request

QUESTIONS = {"q": {"type": "noul"}}


def message(state, rid="r1") -> bytes:
    return msgpack.packb({"v": 1, "id": rid, "op": "decide", "body": {"state": state, "questions": QUESTIONS}})


def test_eight_million_empty_maps_are_refused_fast_with_the_id_and_little_memory():
    payload = message([{}] * 8_000_000)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InvalidRequestError) as err:
            decode_request(payload)
        took, peak = time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Before: decoded whole, 8 million dicts (1.6 GB, about 3 s), then walked (3.5 s more).
    assert err.value.request_id == "r1" and "more than 1,048,576 values or 65,536 maps" in err.value.message
    assert took < 5.0 and peak < 64 << 20, (took, peak)


def test_the_caps_are_exact():
    # The message itself holds five containers: the envelope, body, questions, q, and the state array.
    assert decode_request(message([{}] * (MAX_CONTAINERS - 5))).body["state"][-1] == {}
    with pytest.raises(InvalidRequestError):
        decode_request(message([{}] * (MAX_CONTAINERS - 4)))
    # values: the state's items, plus the rest's pairs (4 envelope, 2 body, 1 questions, 1 q)
    assert len(decode_request(message([0] * (MAX_VALUES - 8))).body["state"]) == MAX_VALUES - 8
    with pytest.raises(InvalidRequestError):
        decode_request(message([0] * (MAX_VALUES - 7)))


def test_an_id_is_still_echoed_when_it_comes_after_the_bomb():
    body = {"state": [{}] * 100_000, "questions": QUESTIONS}
    payload = msgpack.Packer().pack_map_pairs([("v", 1), ("op", "decide"), ("body", body), ("id", "late")])
    with pytest.raises(InvalidRequestError) as err:
        decode_request(payload)
    assert err.value.request_id == "late"


# --- item 4: a socket path another user could swap --------------------------------------------------------


def test_directories_others_may_write_or_symlinks_are_named(tmp_path):
    assert ipc_problem(tmp_path / "jevany" / "d.sock") is None       # private, and what is missing gets made
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)                   # writable by all, and not sticky: anyone may rename entries
    assert "writable by others (mode 0777)" in ipc_problem(loose / "jevany" / "d.sock")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert "is a symlink" in ipc_problem(tmp_path / "link" / "d.sock")


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory another user owns needs root")
def test_a_client_refuses_a_socket_in_a_directory_another_user_made_and_sends_it_nothing(tmp_path):
    # /tmp/jevany-UID made first by someone else (mode 0777), holding a daemon of theirs.
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    os.chown(tmp_path, 0, 0)
    theirs = shared / "jevany-1000"
    (theirs / "jevany").mkdir(parents=True)
    for d in (theirs, theirs / "jevany"):
        os.chown(d, 65534, 65534)
    theirs.chmod(0o777)
    endpoint = f"ipc://{theirs}/jevany/daemon.sock"
    heard = []
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.bind(endpoint)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if fake.poll(50):
                frames = fake.recv_multipart()
                heard.append(frames[-1])
                forged = {"v": 1, "id": msgpack.unpackb(frames[-1])["id"], "ok": True, "result": {"pong": True,
                                                                                                   "version": "x"}}
                fake.send_multipart([*frames[:-1], msgpack.packb(forged)])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        with JevClient(endpoint, timeout=5, retries=0) as client:
            with pytest.raises(JevUnreachableError) as err:
                client.ping()
        assert "belongs to uid 65534" in err.value.message
        assert heard == []                # the request, secrets and all, never reached the impostor
    finally:
        stop.set()
        server.join(5)
        ctx.destroy(linger=0)
