import json
from dataclasses import replace

from typer.testing import CliRunner

from jevany_daemon.cli import app
from jevany_daemon.model.checkpoint import read_meta

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "tiny-model" in result.output


def test_the_commands_summary_names_both_models_tiny_model_builds():
    summary = next(line for line in runner.invoke(app, ["--help"]).output.splitlines() if "tiny-model" in line)
    assert "random" in summary and "--trained" in summary and "starter" in summary


def test_no_arguments_shows_help():
    result = runner.invoke(app, [])
    assert "tiny-model" in result.output


def test_tiny_model_builds_the_requested_kind(tmp_path):
    out = tmp_path / "m"
    result = runner.invoke(app, ["tiny-model", str(out), "--arch", "qwen3_5", "--readout", "lm_token", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert read_meta(out).decision_mode == "lm_token"
    assert json.loads((out / "base" / "config.json").read_text())["model_type"] == "qwen3_5_text"


def test_tiny_model_rejects_unknown_choices(tmp_path):
    for args in (["--arch", "llama"], ["--readout", "letter"], ["--seed", "x"]):
        result = runner.invoke(app, ["tiny-model", str(tmp_path / "m"), *args])
        assert result.exit_code == 2, args
    assert not (tmp_path / "m").exists()


def test_tiny_model_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["tiny-model", str(tmp_path)])
    assert result.exit_code == 1
    assert "not an empty directory" in result.output
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_tiny_model_needs_out_except_when_trained(tmp_path):
    result = runner.invoke(app, ["tiny-model"])
    assert result.exit_code == 2
    assert "missing argument OUT" in result.output


def test_trained_refuses_the_options_of_random_models(tmp_path):
    for args in (["--readout", "pointer"], ["--arch", "qwen3"], ["--multimodal"]):
        result = runner.invoke(app, ["tiny-model", "--trained", str(tmp_path / "m"), *args])
        assert result.exit_code == 2, args
        assert f"{args[0]} does not apply" in result.output
    assert not (tmp_path / "m").exists()


def test_trained_builds_a_checkpoint_and_prints_its_heldout_figures(tmp_path, monkeypatch):
    import jevany_daemon.starter.train as train

    small = train.Recipe(train_items=40, calibration_items=10, heldout_items=10, batch_items=20, head_steps=4,
                         tune_items=20)
    monkeypatch.setattr(train, "Recipe", lambda seed: replace(small, seed=seed))   # seconds, not a minute
    out = tmp_path / "starter"
    result = runner.invoke(app, ["tiny-model", "--trained", str(out), "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert read_meta(out).decision_mode == "pointer" and read_meta(out).extra["starter_recipe"]["seed"] == 3
    assert "accuracy" in result.output and "ECE" in result.output and f"wrote qwen3 pointer checkpoint to {out}" \
        in result.output
    assert len((out / "heldout.jsonl").read_text().splitlines()) == 10
    again = runner.invoke(app, ["tiny-model", "--trained", str(out)])
    assert again.exit_code == 1 and "not an empty directory" in again.output


def test_trained_says_what_it_is_doing_on_stderr_and_keeps_stdout_for_the_figures(tmp_path, monkeypatch):
    import jevany_daemon.starter.train as train

    small = train.Recipe(train_items=40, calibration_items=10, heldout_items=10, batch_items=20, head_steps=4,
                         tune_items=20)
    monkeypatch.setattr(train, "Recipe", lambda seed: replace(small, seed=seed))
    result = runner.invoke(app, ["tiny-model", "--trained", str(tmp_path / "starter")])
    assert result.exit_code == 0, result.output
    said = result.stderr
    stages = ["building the tokenizer and model", "computing the frozen backbone's states: step 2 of 2",
              "training the head (backbone frozen): step 4 of 4, loss ", "tuning the adapter and head together: "
              "step 1 of 1, loss ", "fitting the temperature", "measuring the held-out suite (10 items)"]
    at = [said.find(stage) for stage in stages]
    assert -1 not in at and at == sorted(at), said       # every stage, in order
    assert all(line.startswith("[") for line in said.splitlines()), said      # "[  12 s] ...": one line each
    assert "step" not in result.stdout and "accuracy" in result.stdout


def test_stage_lines_rewrite_one_line_on_a_terminal_and_write_a_line_every_few_seconds_elsewhere():
    import io

    from jevany_daemon.starter.build import StageLines

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def run(stream):
        now = [0.0]
        lines = StageLines(stream, every_s=5.0, clock=lambda: now[0])
        lines.stage("training the head", 100)
        for step in range(1, 101):
            now[0] += 0.5
            lines.step(step, 1.0 / step)
        lines.stage("measuring")
        lines.close()
        return stream.getvalue()

    logged = run(io.StringIO()).splitlines()
    assert logged[0] == "[   0 s] training the head"
    assert logged[1] == "[   5 s] training the head: step 10 of 100, loss 0.1000"
    assert len(logged) == 1 + 10 + 1 and logged[-2].endswith("step 100 of 100, loss 0.0100")    # every 5 s, last
    assert logged[-1] == "[  50 s] measuring"
    drawn = run(Terminal())
    assert drawn.count("\n") == 1 and drawn.endswith("\n")        # one line, finished at the end
    assert drawn.count("\r\x1b[K") == 1 + 100 + 1                 # each redraw clears it: every step (0.5 s > 0.1 s)
