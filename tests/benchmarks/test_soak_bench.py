"""CI runs the soak benchmark's short form: the production mix for 20 s on the tiny model, every request
accounted for and the departed callers' requests dropped; never its timings."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.soak
def test_the_soak_mix_loses_nothing_and_drops_the_departed_callers_work(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak_bench.py"), "--tiny", "--duration-s", "20", "--warmup-s", "10",
         "--sample-s", "5", "--window-s", "10", "--zmq-callers", "3", "--http-callers", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT / "benchmarks")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["lost"] == 0 and report["unexpected_outcomes"] == 0, report["outcomes"]
    outcomes = report["outcomes"]
    for kind in ("decide:ok", "malformed:invalid_request", "http:200", "http_invalid:422"):
        assert outcomes.get(kind, 0) > 0, (kind, outcomes)
    churned = {who: int(sent.split()[1]) for who, sent in report["churn"].items()}
    assert set(churned) == {"zmq-churn", "http-churn"} and min(churned.values()) > 100
    # every churned request was either dropped unscored or scored for nobody; the live ones were all answered
    assert report["departed"] > 0 and report["departed"] + report["scored_for_departed"] <= sum(churned.values())
    assert [w["from_s"] for w in report["windows"]] == [0.0, 10.0]
    assert all(w["requests"] > 0 and w["ms_per_request"] > 0 for w in report["windows"])
    last = report["samples"][-1]["procs"]
    assert set(last) == {"supervisor", "gateway", "worker-0"} and all(p["rss_kb"] > 0 for p in last.values())
    assert set(report["rss_growth"]) == {"supervisor", "gateway", "worker-0"}
    [passes] = report["samples"][-1]["threads"].values()      # the worker's passes by the threads they ran on
    assert sum(passes.values()) == report["samples"][-1]["passes"]
