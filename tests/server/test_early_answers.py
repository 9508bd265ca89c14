"""A hand-over the engine splits into passes is answered pass by pass (the worker's side, no sockets)."""
from jevany_client.protocol import encode_request

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.server.worker import score


def test_each_pass_but_the_last_is_reported_early_and_nothing_twice(loaded_model):
    # no padding allowed: requests of different widths cannot share a pass
    engine = Engine(loaded_model("qwen3", "pointer"),
                    EngineConfig(max_batch_size=8, max_padding_waste=0.0, batch_policy="greedy"))
    bodies = workloads.long_uneven(8, seed=5)
    items = [[i, encode_request(f"r{i}", "decide", body)] for i, body in enumerate(bodies)]
    items.append([99, b"\xc1 not msgpack"])
    early = []
    final = score(engine, items, early=early.append)

    passes = engine.stats.as_dict()["batches"]
    assert passes > 1 and len(early) == passes - 1
    early_tags = [tag for reported in early for tag, _, _ in reported]
    final_tags = [tag for tag, _, _ in final]
    assert sorted(early_tags + final_tags) == [*range(8), 99]        # each answered exactly once
    assert all(ok for reported in early for _, ok, _ in reported)
    [(bad_ok, bad)] = [(ok, payload) for tag, ok, payload in final if tag == 99]
    assert bad_ok is False and bad["code"] == "invalid_message"
    serial = {i: engine.score([engine.admit(b)])[0] for i, b in enumerate(bodies)}
    for tag, ok, result in [r for reported in early for r in reported] + [r for r in final if r[0] != 99]:
        assert ok and result["answers"].keys() == serial[tag]["answers"].keys()


def test_without_a_listener_everything_comes_back_at_the_end(loaded_model):
    engine = Engine(loaded_model("qwen3", "pointer"),
                    EngineConfig(max_batch_size=8, max_padding_waste=0.0, batch_policy="greedy"))
    items = [[i, encode_request(i, "decide", b)] for i, b in enumerate(workloads.long_uneven(6, seed=5))]
    assert sorted(tag for tag, ok, _ in score(engine, items) if ok) == list(range(6))


def test_each_requests_tenant_reaches_the_engine(loaded_model):
    # The supervisor's tenant salt (a CurveZMQ key's, an ipc uid's, the HTTP token's) rides as the
    # hand-over item's last field; the engine keys its prefix cache by what admit() is given.
    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8))
    admitted, real_admit = [], engine.admit

    def admit(body, origin=None, tenant=None):
        admitted.append(real_admit(body, origin, tenant=tenant))
        return admitted[-1]

    engine.admit = admit
    [body] = workloads.short(1, seed=3)
    payload = encode_request("r", "decide", body)
    outcomes = score(engine, [[0, payload, "zmq", None, "a" * 32], [1, payload, "http", None, None], [2, payload]])
    assert [ok for _, ok, _ in outcomes] == [True, True, True]
    assert [a.tenant for a in admitted] == ["a" * 32, None, None]
