import json

from typer.testing import CliRunner

from jevany_daemon.cli import app
from jevany_daemon.model.checkpoint import read_meta

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "tiny-model" in result.output


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
