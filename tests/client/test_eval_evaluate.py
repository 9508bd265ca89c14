"""The run's own choices before anything is sent: where results go, what it refuses, how long the first ping waits."""
import asyncio
import json

import pytest

from jevany_client.errors import JevTimeoutError
from jevany_client.eval.errors import EvalError
from jevany_client.eval.evaluate import Options, _reach, default_out, evaluate
from jevany_client.eval.shards import Shard
from jevany_client.eval.suite import read_suite

from .test_eval_metrics import NOUL


def test_results_go_beside_the_suite_named_after_it_and_its_shard():
    assert default_out("runs/suite.jsonl") == "runs/suite.results.jsonl"
    assert default_out("runs/suite.json") == "runs/suite.json.results.jsonl"
    assert default_out("runs/suite") == "runs/suite.results.jsonl"
    assert default_out("runs/suite.jsonl", Shard(1, 4)) == "runs/suite.shard-1-of-4.results.jsonl"
    assert default_out("runs/suite.jsonl", Shard(0, 4)) == "runs/suite.shard-0-of-4.results.jsonl"   # not the run's
    assert default_out("runs/suite.json", Shard(0, 2)) == "runs/suite.json.shard-0-of-2.results.jsonl"


class Pinged:
    def __init__(self, fail: Exception | None = None):
        self.endpoints, self.fail, self.timeouts = ["ipc:///nowhere"], fail, []

    async def ping(self, timeout):
        self.timeouts.append(timeout)
        if self.fail:
            raise self.fail


def test_the_first_ping_waits_at_most_10_s_or_the_request_timeout_if_shorter():
    client = Pinged()
    asyncio.run(_reach(client, 60.0))
    asyncio.run(_reach(client, 3.0))
    assert client.timeouts == [10.0, 3.0]
    with pytest.raises(EvalError, match=r"daemon not reachable at ipc:///nowhere within 10s"):
        asyncio.run(_reach(Pinged(JevTimeoutError("late")), 60.0))


@pytest.fixture
def suite(tmp_path) -> str:
    path = tmp_path / "suite.jsonl"
    path.write_text(json.dumps({"state": 0, "questions": {"u": NOUL}, "labels": {"u": True}}) + "\n")
    return str(path)


@pytest.mark.parametrize("options, message", [
    ({"serve": "--model m", "endpoints": ["tcp://127.0.0.1:1"]}, "give --endpoint or --serve, not both"),
    ({"shard": "0/2", "compare": "other.jsonl"}, "merge the shards first"),
])
def test_options_that_cannot_go_together_are_refused_before_anything_is_written(suite, tmp_path, options, message):
    with pytest.raises(EvalError, match=message):
        evaluate(Options(suite, out=str(tmp_path / "out.jsonl"), **options), echo=lambda line: None)
    assert not (tmp_path / "out.jsonl").exists()


def test_a_shard_runs_its_own_items_and_only_those(suite, tmp_path):
    # One item: one of two shards holds it and sends it (to no daemon here), the other has nothing to send.
    item = read_suite(suite)[0]
    holder = next(i for i in range(2) if Shard(i, 2).holds(item))
    said = []
    nobody = [f"ipc://{tmp_path}/nobody.sock"]
    assert evaluate(Options(suite, endpoints=nobody, shard=f"{1 - holder}/2"), echo=said.append) == 0
    assert said == [f"shard-{1 - holder}-of-2 holds none of the suite's items; "
                    f"{default_out(suite, Shard(1 - holder, 2))} stays empty"]
    with pytest.raises(EvalError, match="no daemon at"):
        evaluate(Options(suite, endpoints=nobody, shard=f"{holder}/2"), echo=said.append)
