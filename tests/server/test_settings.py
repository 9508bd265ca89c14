"""Settings precedence and validation (no processes)."""
import pytest

from jevany_daemon.server.settings import SettingsError, resolve


def test_flag_beats_env_beats_file_beats_default(tmp_path):
    toml = tmp_path / "jevany.toml"
    toml.write_text('max_batch_size = 4\nmax_queue = 10\ndevice = "cpu"\nbind = "ipc:///tmp/x.sock"\nlayout = "rows"\n')
    env = {"JEVANY_MAX_BATCH_SIZE": "8", "JEVANY_MAX_QUEUE": "20"}
    s = resolve({"max_batch_size": 16}, toml, env=env)
    assert s.engine.max_batch_size == 16          # flag
    assert s.max_queue == 20                      # env over file
    assert s.engine.layout == "rows"              # file over default
    assert s.endpoints == ("ipc:///tmp/x.sock",)
    assert s.engine.max_packed_tokens == 8192     # default
    assert resolve({}, None, env={}).engine.max_batch_size == 1


def test_defaults_bind_ipc_only(monkeypatch, tmp_path):
    monkeypatch.delenv("JEVANY_ENDPOINT", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    s = resolve({}, None, env={})
    assert s.endpoints == (f"ipc://{tmp_path}/jevany/daemon.sock",)
    assert s.control_endpoint == f"ipc://{tmp_path}/jevany/control.sock"
    assert resolve({"control": ""}, None, env={}).control_endpoint is None


@pytest.mark.parametrize("flags,env,message", [
    ({"max_queue": 0}, {}, "max_queue must be an integer >= 1"),
    ({}, {"JEVANY_MAX_PADDING_WASTE": "2"}, "max_padding_waste must be between 0 and 1"),
    ({}, {"JEVANY_LOG_REQUESTS": "sometimes"}, "JEVANY_LOG_REQUESTS"),
    ({"readout": "vibes"}, {}, "readout must be one of"),
    ({"bind": ("ipc:///tmp/a",), "control": "ipc:///tmp/a"}, {}, "control endpoint must differ"),
    ({"bind": ("tcp://127.0.0.1",)}, {}, "must be ipc://PATH or tcp://HOST:PORT"),
])
def test_invalid_settings_name_the_setting(flags, env, message):
    with pytest.raises(SettingsError, match=message):
        resolve(flags, None, env=env)


def test_bad_config_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("max_batch_size = [")
    with pytest.raises(SettingsError, match="not valid TOML"):
        resolve({}, bad, env={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("max_bath_size = 3\n")
    with pytest.raises(SettingsError, match="unknown settings"):
        resolve({}, unknown, env={})
    with pytest.raises(SettingsError, match="does not exist"):
        resolve({}, tmp_path / "nope.toml", env={})
