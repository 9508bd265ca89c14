"""The worker's loop, without sockets: each pass answered as it ends, and the device kept busy.

A fake socket plays the supervisor: it holds the messages the worker will
read (and may add more when the first pass is launched, as a hand-over that
arrives while the device runs) and records what the worker sends.
"""
import hashlib
import os
import time
from collections import deque

import torch
import zmq

from jevany_client.errors import InvalidRequestError
from jevany_client.protocol import encode_request

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.stream import make_stream
from jevany_daemon import channel
from jevany_daemon.media.files import PrivateCopies
from jevany_daemon.worker import loop as loop_module
from jevany_daemon.worker.loop import WorkerLoop


class FakeSupervisor:
    def __init__(self, *messages):
        self.inbound = deque(channel.encode(*m) for m in messages)
        self.sent = []

    def poll(self, timeout_ms):
        return 1 if self.inbound else 0

    def getsockopt(self, option):
        assert option == zmq.EVENTS
        return int(zmq.POLLIN) if self.inbound else 0

    def recv(self, flags=0):
        if not self.inbound:
            raise zmq.Again()
        return self.inbound.popleft()

    def send(self, payload):
        self.sent.append(channel.decode(payload))

    def answers(self):
        return [(kind, answers, seq) for kind, answers, _stats, _records, seq in
                (m for m in self.sent if m[0] in (channel.EARLY, channel.RESULTS))]


def items(bodies, first_tag=0):
    return [[first_tag + i, encode_request(f"r{first_tag + i}", "decide", b), "zmq", None]
            for i, b in enumerate(bodies)]


def run(engine, supervisor):
    assert WorkerLoop(supervisor, engine, [], parent=0).run() == 0


def uneven_engine(loaded_model, **settings):
    # no padding allowed: requests of different widths cannot share a pass
    return Engine(loaded_model("qwen3", "pointer"),
                  EngineConfig(max_batch_size=8, max_padding_waste=0.0, batch_policy="greedy"), **settings)


def test_each_pass_is_answered_as_it_ends_and_nothing_twice(loaded_model):
    engine = uneven_engine(loaded_model)
    bodies = workloads.long_uneven(8, seed=5)
    supervisor = FakeSupervisor((channel.BATCH, items(bodies) + [[99, b"\xc1 not msgpack", "zmq", None]], 1),
                                (channel.STOP,))
    run(engine, supervisor)

    messages = supervisor.answers()
    passes = engine.stats.as_dict()["batches"]
    assert passes > 1 and len(messages) == passes
    assert [kind for kind, _, _ in messages] == [channel.EARLY] * (passes - 1) + [channel.RESULTS]
    assert all(seq == 1 for _, _, seq in messages)
    tags = [tag for _, answers, _ in messages for tag, _, _ in answers]
    assert sorted(tags) == [*range(8), 99]                           # each answered exactly once
    [(bad_ok, bad)] = [(ok, out) for _, answers, _ in messages for tag, ok, out in answers if tag == 99]
    assert bad_ok is False and bad["code"] == "invalid_message"
    serial = {i: engine.score([engine.admit(b)])[0] for i, b in enumerate(bodies)}
    for _, answers, _ in messages:
        for tag, ok, result in answers:
            if tag != 99:
                assert ok and result["answers"].keys() == serial[tag]["answers"].keys()


def test_each_pass_is_recorded_once_in_the_message_that_answers_it(loaded_model):
    # The supervisor adds every record it gets to its metrics and its pace (pace.py): a record sent again with a
    # later message would count its pass twice.
    batches = []
    engine = uneven_engine(loaded_model, observer=batches.append)
    supervisor = FakeSupervisor((channel.BATCH, items(workloads.long_uneven(8, seed=5)), 1), (channel.STOP,))
    assert WorkerLoop(supervisor, engine, batches, parent=0).run() == 0

    messages = [m for m in supervisor.sent if m[0] in (channel.EARLY, channel.RESULTS)]
    records = [[channel.PassRecord.read(r) for r in m[3]] for m in messages]
    assert engine.stats.batches > 1 and [len(r) for r in records] == [1] * engine.stats.batches
    assert [r.size for rs in records for r in rs] == [len(m[1]) for m in messages]      # its own answers


def _order_of(engine, supervisor_at_first_launch=None):
    """Record launches and finishes (by pass) as the loop runs them."""
    events, launch, finish = [], engine.launch, engine.passes.finish

    def launched(batch):
        events.append(("launch", len([e for e in events if e[0] == "launch"])))
        if supervisor_at_first_launch is not None and len(events) == 1:
            supervisor_at_first_launch()
        return launch(batch)

    def finished(pass_):
        events.append(("finish", len([e for e in events if e[0] == "finish"])))
        return finish(pass_)

    engine.launch, engine.passes.finish = launched, finished
    return events


def test_on_an_accelerator_the_next_pass_is_queued_before_this_ones_answers_are_shaped(loaded_model):
    engine = uneven_engine(loaded_model, simulated_pass_ms=5)
    assert engine.stream.asynchronous
    events = _order_of(engine)
    run(engine, FakeSupervisor((channel.BATCH, items(workloads.long_uneven(4, seed=5)), 1), (channel.STOP,)))
    assert len(events) == 8
    for n in range(3):
        assert events.index(("launch", n + 1)) < events.index(("finish", n))


def test_on_a_cpu_a_pass_is_answered_before_the_next_runs(loaded_model):
    engine = uneven_engine(loaded_model)
    assert not engine.stream.asynchronous
    events = _order_of(engine)
    run(engine, FakeSupervisor((channel.BATCH, items(workloads.long_uneven(4, seed=5)), 1), (channel.STOP,)))
    assert events == [(kind, n) for n in range(4) for kind in ("launch", "finish")]


def test_a_hand_over_that_arrives_while_a_pass_runs_is_admitted_then_and_reported_read(loaded_model):
    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8, batch_policy="greedy"),
                    simulated_pass_ms=5)
    bodies = workloads.short(8, seed=3)
    supervisor = FakeSupervisor((channel.BATCH, items(bodies[:4]), 1))
    admitted_during_pass = []
    admit_many = engine.admit_many

    def admit(batch, origins, tenants):
        admitted_during_pass.append(any(e[0] == "launch" for e in events) and not any(e[0] == "finish" for e in events))
        return admit_many(batch, origins, tenants)

    engine.admit_many = admit
    # Admitted before the worker starts waiting for the device, not only once the wait is over.
    admitted_at_wait, wait = [], engine.stream.wait
    engine.stream.wait = lambda ticket: (admitted_at_wait.append(len(admitted_during_pass)), wait(ticket))[1]
    events = _order_of(engine, lambda: supervisor.inbound.extend(
        [channel.encode(channel.BATCH, items(bodies[4:], first_tag=4), 2), channel.encode(channel.STOP)]))
    run(engine, supervisor)

    assert admitted_during_pass == [False, True]          # the second hand-over, while pass 0 ran
    assert admitted_at_wait[0] == 2
    messages = supervisor.answers()
    assert messages[-1][0] == channel.RESULTS and messages[-1][2] == 2
    assert sorted(tag for _, answers, _ in messages for tag, ok, _ in answers if ok) == list(range(8))
    assert engine.stats.batches == 2                      # the four that came late share one pass


def test_a_cuda_device_overlaps_as_the_simulated_accelerator_does():
    # What makes the worker overlap its passes, the supervisor hand a busy worker the next pass's worth,
    # and the batch policy stop timing lone requests. (No CUDA call: a stream only keeps its device.)
    assert make_stream(torch.device("cuda")).asynchronous and make_stream(torch.device("cuda", 1)).asynchronous
    assert make_stream(torch.device("cpu"), simulated_pass_ms=5).asynchronous
    assert not make_stream(torch.device("cpu")).asynchronous


def _during_first_wait(engine, then):
    """Call then() once, as the worker starts waiting for its first pass (the device running it)."""
    wait, called = engine.stream.wait, []

    def waiting(ticket):
        if not called:
            called.append(then())
        return wait(ticket)

    engine.stream.wait = waiting


def test_a_hand_over_that_lands_while_the_worker_waits_is_launched_before_the_pass_is_answered(loaded_model):
    # The supervisor hands the next pass's worth over when it hears of this pass's answers (EARLY) from
    # the pass before: mostly while the worker waits for the device.
    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8, batch_policy="greedy"),
                    simulated_pass_ms=20)
    bodies = workloads.short(8, seed=3)
    supervisor = FakeSupervisor((channel.BATCH, items(bodies[:4]), 1))
    _during_first_wait(engine, lambda: supervisor.inbound.extend(
        [channel.encode(channel.BATCH, items(bodies[4:], first_tag=4), 2), channel.encode(channel.STOP)]))
    events = _order_of(engine)
    run(engine, supervisor)

    assert events == [("launch", 0), ("launch", 1), ("finish", 0), ("finish", 1)]
    messages = supervisor.answers()
    assert [(kind, seq) for kind, _, seq in messages] == [(channel.EARLY, 2), (channel.RESULTS, 2)]
    assert sorted(tag for _, answers, _ in messages for tag, ok, _ in answers if ok) == list(range(8))


def test_a_hand_over_that_sat_unread_past_its_deadline_is_never_scored(loaded_model):
    # Sent with 50 ms left while the device ran a 300 ms pass: by the time the worker reads it, its
    # deadline has passed, though 50 ms from the reading would not have.
    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8, batch_policy="greedy"),
                    simulated_pass_ms=300)
    bodies = workloads.short(3, seed=4)
    supervisor = FakeSupervisor((channel.BATCH, items(bodies[:1]), 1))

    def hand_over():
        sent_at = time.monotonic()
        late = [item + [0.05, None, sent_at] for item in items(bodies[1:2], first_tag=1)]
        ample = [item + [60.0, None, sent_at] for item in items(bodies[2:], first_tag=2)]
        supervisor.inbound.extend([channel.encode(channel.BATCH, late + ample, 2), channel.encode(channel.STOP)])

    _during_first_wait(engine, hand_over)
    run(engine, supervisor)

    outcomes = {tag: (ok, out) for _, answers, _ in supervisor.answers() for tag, ok, out in answers}
    assert sorted(outcomes) == [0, 1, 2]
    assert outcomes[1][0] is False and outcomes[1][1]["code"] == "deadline_exceeded"
    assert outcomes[0][0] and outcomes[2][0]
    assert engine.stats.as_dict()["requests"] == 2


def test_what_a_worker_took_ahead_and_held_past_its_deadline_is_never_scored(loaded_model):
    # The next pass's worth, taken while the device ran: one request of it had 0 s left when it came,
    # one 60 s, one no deadline at all.
    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8, batch_policy="greedy"),
                    simulated_pass_ms=5)
    bodies = workloads.short(4, seed=4)
    late = items(bodies[1:], first_tag=1)
    late[0].append(0.0)          # its deadline passes before its pass can begin
    late[1].append(60.0)
    supervisor = FakeSupervisor((channel.BATCH, items(bodies[:1]), 1))
    _order_of(engine, lambda: supervisor.inbound.extend(
        [channel.encode(channel.BATCH, late, 2), channel.encode(channel.STOP)]))
    run(engine, supervisor)

    answered = [(tag, ok, out) for _, answers, _ in supervisor.answers() for tag, ok, out in answers]
    assert sorted(tag for tag, _, _ in answered) == [0, 1, 2, 3]          # each answered once
    outcomes = {tag: (ok, out) for tag, ok, out in answered}
    assert outcomes[1][0] is False and outcomes[1][1]["code"] == "deadline_exceeded"
    assert outcomes[0][0] and outcomes[2][0] and outcomes[3][0]
    assert engine.stats.as_dict()["requests"] == 3      # scored: the three with time left, never the late one


def test_each_requests_tenant_reaches_the_engine(loaded_model):
    # The supervisor's tenant salt (a CurveZMQ key's, an ipc uid's, the HTTP token's) rides as the
    # hand-over item's last field; the engine keys its prefix cache by it.
    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8))
    seen, keyed, admit_many = [], [], engine.admit_many

    def admit(bodies, origins, tenants):
        out = admit_many(bodies, origins, tenants)
        seen.extend(a.tenant for a in out)
        keyed.extend(a.encoded.tenant for a in out)     # what the prefix cache keys its entries by
        return out

    engine.admit_many = admit
    [body] = workloads.short(1, seed=3)
    payload = encode_request("r", "decide", body)
    hand_over = [[0, payload, "zmq", None, None, "a" * 32], [1, payload, "http", None, 30.0, None], [2, payload]]
    supervisor = FakeSupervisor((channel.BATCH, hand_over, 1), (channel.STOP,))
    run(engine, supervisor)
    assert sorted(tag for _, answers, _ in supervisor.answers() for tag, ok, _ in answers if ok) == [0, 1, 2]
    assert seen == ["a" * 32, None, None]
    assert keyed == seen


# --- media: the worker's private copies live only until the request is answered ---------------

def _media_run(loaded_model, tmp_path, monkeypatch, media_of, admit_error=None):
    """Run the loop on one request per entry of media_of (its [[type, path, [size, sha256]]...]) and
    return every PrivateCopies the worker made. The text model scores the request without its media
    (stripped on the way into the engine); admit_error: tags the engine refuses at admission."""
    made = []

    class Recorded(PrivateCopies):
        def __init__(self):
            super().__init__()
            self.opened = []
            made.append(self)

        def add(self, data):
            uri = super().add(data)
            self.opened.append(self.fds[-1])
            return uri

    monkeypatch.setattr(loop_module, "PrivateCopies", Recorded)
    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8, batch_policy="greedy"))
    admit_many = engine.admit_many

    def admit(bodies, origins, tenants):
        out = admit_many([{k: v for k, v in b.items() if k != "media"} for b in bodies], origins, tenants)
        return [refused if i in (admit_error or ()) else a for i, a in enumerate(out)]

    refused = InvalidRequestError("refused at admission")
    engine.admit_many = admit
    data = b"\x89PNG not really, but bytes the checker checked"
    good = tmp_path / "a.png"
    good.write_bytes(data)
    stamp = [len(data), hashlib.sha256(data).hexdigest()]
    bodies = workloads.short(len(media_of), seed=5)
    hand_over = [item[:3] + [media(str(good), stamp)] for item, media in zip(items(bodies), media_of)]
    supervisor = FakeSupervisor((channel.BATCH, hand_over, 1), (channel.STOP,))
    run(engine, supervisor)
    outcomes = {tag: ok for _, answers, _ in supervisor.answers() for tag, ok, _ in answers}
    return made, outcomes


def _media_fds() -> int:
    """This process's open private copies (memfds named jevany-media), whatever their numbers."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += "jevany-media" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return count


def test_a_media_requests_private_copies_are_closed_once_it_is_answered(loaded_model, tmp_path, monkeypatch):
    two = lambda path, stamp: [["image", path, stamp], ["image", path, stamp]]
    before = _media_fds()
    made, outcomes = _media_run(loaded_model, tmp_path, monkeypatch, [two, two, lambda p, s: None])
    assert outcomes == {0: True, 1: True, 2: True}
    opened = [fd for copies in made for fd in copies.opened]
    assert len(opened) == 4                                    # one memfd per media file of each request
    assert all(not copies.fds for copies in made)
    assert _media_fds() == before                              # else one descriptor leaks per media file


def test_private_copies_are_closed_when_the_engine_refuses_the_request(loaded_model, tmp_path, monkeypatch):
    one = lambda path, stamp: [["image", path, stamp]]
    before = _media_fds()
    made, outcomes = _media_run(loaded_model, tmp_path, monkeypatch, [one, one], admit_error={0})
    assert outcomes == {0: False, 1: True}
    opened = [fd for copies in made for fd in copies.opened]
    assert len(opened) == 2 and _media_fds() == before


def test_private_copies_made_before_a_file_that_changed_are_closed(loaded_model, tmp_path, monkeypatch):
    # The first file reads as checked, the second does not: the request is refused, and the copy
    # already made of the first is not kept.
    changed = lambda path, stamp: [["image", path, stamp], ["image", path, [stamp[0], "0" * 64]]]
    before = _media_fds()
    made, outcomes = _media_run(loaded_model, tmp_path, monkeypatch, [changed])
    assert outcomes == {0: False}
    opened = [fd for copies in made for fd in copies.opened]
    assert len(opened) == 1 and _media_fds() == before
