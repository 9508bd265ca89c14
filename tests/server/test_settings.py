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


def test_workers_and_devices():
    assert resolve({}, None, env={}).worker_devices() == ["cpu"]
    assert resolve({"workers": 2}, None, env={}).worker_devices() == ["cpu", "cpu"]
    assert resolve({"device": "cuda:0,cuda:1"}, None, env={}).worker_devices() == ["cuda:0", "cuda:1"]
    four = resolve({}, None, env={"JEVANY_DEVICE": "cuda:0, cuda:1", "JEVANY_WORKERS": "4"})
    assert four.worker_devices() == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert four.worker_settings("cuda:1")["device"] == "cuda:1"
    assert four.worker_settings("cuda:1")["cpu_threads"] is None


def test_cpu_threads(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert resolve({}, None, env={}).worker_settings("cpu")["cpu_threads"] == 8
    assert resolve({"workers": 3}, None, env={}).worker_settings("cpu")["cpu_threads"] == 2
    assert resolve({"cpu_threads": 3}, None, env={}).worker_settings("cpu")["cpu_threads"] == 3
    assert resolve({}, None, env={"JEVANY_CPU_THREADS": "1"}).worker_settings("cpu")["cpu_threads"] == 1


def test_device_lists_in_toml_and_socket_modes(tmp_path):
    toml = tmp_path / "jevany.toml"
    toml.write_text('device = ["cuda:0", "cuda:1"]\nsocket_mode = 0o660\n')
    s = resolve({}, toml, env={})
    assert s.devices == ("cuda:0", "cuda:1") and s.socket_mode == 0o660
    assert resolve({}, None, env={"JEVANY_SOCKET_MODE": "0640"}).socket_mode == 0o640


@pytest.mark.parametrize("flags,env,message", [
    ({"workers": 0}, {}, "workers must be an integer >= 1"),
    ({"cpu_threads": 0}, {}, "cpu_threads must be an integer >= 1"),
    ({}, {"JEVANY_CPU_THREADS": "all"}, "JEVANY_CPU_THREADS"),
    ({}, {"JEVANY_WORKERS": "two"}, "JEVANY_WORKERS"),
    ({"workers": 3, "device": "cuda:0,cuda:1"}, {}, "cannot be spread evenly over the 2 devices"),
    ({"device": "cuda:0,cuda:0"}, {}, "twice; use --workers"),
    ({"device": "cuda:0,gpu"}, {}, "device must be cpu, cuda or cuda:N"),
    ({"heartbeat_timeout": 0.0}, {}, "heartbeat_timeout must be a number of seconds > 0"),
    ({}, {"JEVANY_BATCH_TIMEOUT": "-1"}, "batch_timeout must be a number of seconds > 0"),
    ({}, {"JEVANY_SOCKET_MODE": "rw-rw----"}, "JEVANY_SOCKET_MODE"),
    ({"metrics_port": 70000}, {}, "metrics_port must be a port number"),
    ({"bind": ("tcp://0.0.0.0:5555",)}, {}, "without CurveZMQ"),
    ({"bind": ("tcp://10.1.2.3:5555",)}, {}, "without CurveZMQ"),
    ({"bind": ("tcp://myhost:5555",)}, {}, "without CurveZMQ"),
    ({"control": "tcp://*:5556"}, {}, "without CurveZMQ"),
    ({"curve_allowed_clients": "/tmp"}, {}, "go together"),
])
def test_invalid_pool_and_security_settings(flags, env, message):
    with pytest.raises(SettingsError, match=message):
        resolve(flags, None, env=env)


def test_loopback_tcp_is_fine_and_insecure_opens_the_rest(tmp_path):
    for bind in ("tcp://127.0.0.1:5555", "tcp://localhost:5555", "tcp://[::1]:5555", "tcp://127.0.0.2:5555"):
        assert resolve({"bind": (bind,)}, None, env={}).endpoints == (bind,)
    assert resolve({"bind": ("tcp://0.0.0.0:5555",), "insecure": True}, None, env={}).insecure
    assert resolve({"bind": ("tcp://0.0.0.0:5555",)}, None, env={"JEVANY_INSECURE": "1"}).insecure
    key = tmp_path / "server.key_secret"
    key.write_text("")
    curve = resolve({"bind": ("tcp://0.0.0.0:5555",), "curve_secret_key": str(key),
                     "curve_allowed_clients": str(tmp_path)}, None, env={})
    assert curve.curve and not curve.insecure
    with pytest.raises(SettingsError, match="is not a directory"):
        resolve({"curve_secret_key": str(key), "curve_allowed_clients": str(key)}, None, env={})


def test_a_reload_takes_the_model_settings_and_lists_the_rest():
    running = resolve({"max_queue": 10, "model": "/m/a"}, None, env={})
    fresh = resolve({"max_queue": 20, "model": "/m/b", "workers": 2, "max_batch_size": 8}, None, env={})
    taken, needs_restart = running.with_reloaded(fresh)
    assert (taken.model, taken.worker_count, taken.engine.max_batch_size) == ("/m/b", 2, 8)
    assert taken.max_queue == 10 and needs_restart == ["max_queue"]
