"""serve's options are built from the settings' declarations: every flag, JevAny's names for it and
its legacy spelling reach the setting they name, and what is not given stays None."""
import pytest
import typer
from click.testing import CliRunner

from jevany_daemon.cli import app
from jevany_daemon.server import settings as settings_module
from jevany_daemon.server.settings import SETTINGS, SettingsError


@pytest.fixture
def given(monkeypatch):
    """Runs serve with some arguments; returns the flags it would resolve (resolve stops it, exit 2)."""
    seen = []

    def resolve(flags, config_file=None, **_):
        seen.append((flags, config_file))
        raise SettingsError("stop here")

    monkeypatch.setattr(settings_module, "resolve", resolve)
    command = typer.main.get_command(app)

    def run(*args):
        result = CliRunner().invoke(command, ["serve", *args])
        assert result.exit_code == 2, result.output
        assert seen, result.output
        return seen.pop()
    return run


def flag_sample(s) -> tuple[list[str], object]:
    """Arguments giving the setting, and the value resolve should get."""
    if s.kind is bool:
        return [s.cli_flag], True
    if s.kind is tuple:
        return [s.cli_flag, "ipc:///a", s.cli_flag, "ipc:///b"], ("ipc:///a", "ipc:///b")
    text, value = {int: ("3", 3), float: ("0.5", 0.5), str: ("x", "x")}[s.kind]
    return [s.cli_flag, "0660" if s.name == "socket_mode" else text], 0o660 if s.name == "socket_mode" else value


def test_nothing_given_is_none_everywhere(given):
    flags, config = given()
    assert config is None
    assert set(flags) == {s.name for s in SETTINGS if s.flag}
    assert all(v is None or v == () for v in flags.values())


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.flag], ids=lambda s: s.name)
def test_every_flag_reaches_its_setting(given, s):
    args, value = flag_sample(s)
    flags, _ = given(*args)
    assert flags[s.name] == value
    assert [name for name, v in flags.items() if v not in (None, ())] == [s.name]
    for other in (*s.jevany_flags, *([s.legacy_flag] if s.legacy_flag else [])):
        assert given(other, *args[1:])[0][s.name] == value, other
    if s.kind is bool:
        assert given(f"--no-{s.cli_flag[2:]}")[0][s.name] is False


def test_jevanys_host_and_port_are_http_and_config_is_a_path(given, tmp_path):
    assert given("--port", "9000")[0]["http"] == "127.0.0.1:9000"
    assert given("--config", str(tmp_path / "x.toml"))[1] == tmp_path / "x.toml"
