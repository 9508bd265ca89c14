"""Which outcomes jevany-eval writes as final, and which it tries again (against the fake daemon)."""
import json

from typer.testing import CliRunner

from jevany_client.cli import eval_app

from .test_eval_metrics import NOUL


def test_final_errors_are_written_retryable_ones_never_and_patience_ends_the_run(tmp_path, daemon):
    # The fake daemon answers a state "error:CODE" with that error, and echoes anything else
    # with no answers at all, which fails the client's self-check.
    states = ["error:invalid_request", "error:worker_lost", {"echo": 1}]
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"state": s, "questions": {"u": NOUL}, "labels": {"u": True}}) + "\n"
                             for s in states))
    out, report = tmp_path / "results.jsonl", tmp_path / "report.json"
    result = CliRunner().invoke(eval_app, [str(suite), "--endpoint", daemon.endpoint, "--out", str(out),
                                           "--report", str(report), "--patience", "0.3", "--no-progress"])
    assert result.exit_code == 3, result.output                 # items left: run again
    assert "stopped early: no item finished for" in result.stdout
    assert "tried again after: worker_lost" in result.stdout
    records = {r["index"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {0, 2}                                # worker_lost is never written
    assert records[0]["error"]["code"] == "invalid_request"
    assert records[2]["error"]["code"] == "invalid_answer"
    written = json.loads(report.read_text())
    assert written["complete"] is False
    assert written["items"] == {"answered": 0, "errors": 2, "not_done": 1}
    assert written["overall"]["errors_by_code"] == {"invalid_answer": 1, "invalid_request": 1}
    assert written["by_type"]["noul"]["errors_by_code"] == {"invalid_answer": 1, "invalid_request": 1}
