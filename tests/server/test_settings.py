"""Settings precedence and validation (no processes, but for the real command line's exit codes)."""
import os
import subprocess
import sys

import pytest

from jevany_daemon.server.settings import ENGINE_FIELDS, SERVE_FIELDS, SettingsError, resolve


def gpus(n: int):
    """A fake host with n CUDA devices, for resolve(cuda_count=...)."""
    return lambda: n


def no_probe():
    raise AssertionError("CUDA devices were counted though none was named")


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
    assert resolve({"device": "cuda:0,cuda:1"}, None, env={}, cuda_count=gpus(2)).worker_devices() == [
        "cuda:0", "cuda:1"]
    four = resolve({}, None, env={"JEVANY_DEVICE": "cuda:0, cuda:1", "JEVANY_WORKERS": "4"}, cuda_count=gpus(2))
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
    s = resolve({}, toml, env={}, cuda_count=gpus(2))
    assert s.devices == ("cuda:0", "cuda:1") and s.socket_mode == 0o660
    assert resolve({}, None, env={"JEVANY_SOCKET_MODE": "0640"}).socket_mode == 0o640


@pytest.mark.parametrize("flags,env,message", [
    ({"workers": 0}, {}, "workers must be an integer >= 1"),
    ({"cpu_threads": 0}, {}, "cpu_threads must be an integer >= 1"),
    ({}, {"JEVANY_CPU_THREADS": "all"}, "JEVANY_CPU_THREADS"),
    ({}, {"JEVANY_WORKERS": "two"}, "JEVANY_WORKERS"),
    ({"workers": 3, "device": "cuda:0,cuda:1"}, {}, "cannot be spread evenly over the 2 devices"),
    ({"device": "cuda:0,cuda:0"}, {}, "twice .*; use --workers"),
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


def test_errors_name_the_flag_variable_or_file_the_value_came_from(tmp_path):
    with pytest.raises(SettingsError, match=r"^JEVANY_MAX_BATCH_SIZE: max_batch_size must be an integer >= 1, got -3$"):
        resolve({}, None, env={"JEVANY_MAX_BATCH_SIZE": "-3"})
    with pytest.raises(SettingsError, match=r"^--max-batch-size: max_batch_size must be"):
        resolve({"max_batch_size": 0}, None, env={"JEVANY_MAX_BATCH_SIZE": "4"})      # the flag won
    config = tmp_path / "serve.toml"
    config.write_text("max_queue = 0\n")
    with pytest.raises(SettingsError, match=rf"^--config {config}: max_queue must be an integer >= 1"):
        resolve({}, config, env={})


def test_a_model_path_that_is_not_there_is_a_settings_error(tmp_path, monkeypatch):
    """Found before any worker starts (exit 2, as every settings error), not as a worker's load failure."""
    (tmp_path / "hub" / "models--Qwen--Qwen3.5-0.8B" / "snapshots" / "0123abc").mkdir(parents=True)
    (tmp_path / "hub" / "models--Qwen--Qwen3.5-0.8B" / "refs").mkdir()
    (tmp_path / "hub" / "models--Qwen--Qwen3.5-0.8B" / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))      # a hub id is taken where it is cached
    with pytest.raises(SettingsError, match=rf"^--model: model does not exist: {tmp_path}/nope$"):
        resolve({"model": str(tmp_path / "nope")}, None, env={})
    (tmp_path / "file").write_text("")
    with pytest.raises(SettingsError, match=r"^JEVANY_MODEL: model source is not a directory: "):
        resolve({}, None, env={"JEVANY_MODEL": str(tmp_path / "file")})
    assert resolve({"model": "Qwen/Qwen3.5-0.8B@main"}, None, env={}).model == "Qwen/Qwen3.5-0.8B@main"   # a hub id


def test_a_reload_takes_the_model_settings_and_lists_the_rest(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    running = resolve({"max_queue": 10, "model": str(a)}, None, env={})
    fresh = resolve({"max_queue": 20, "model": str(b), "workers": 2, "max_batch_size": 8}, None, env={})
    taken, needs_restart = running.with_reloaded(fresh)
    assert (taken.model, taken.worker_count, taken.engine.max_batch_size) == (str(b), 2, 8)
    assert taken.max_queue == 10 and needs_restart == ["max_queue"]


# --- devices ------------------------------------------------------------------------------

def test_cuda_is_cuda_0_so_a_list_cannot_name_it_twice():
    s = resolve({"device": "cuda"}, None, env={}, cuda_count=gpus(1))
    assert s.devices == ("cuda:0",) and s.worker_devices() == ["cuda:0"]
    assert s.worker_settings("cuda:0")["device"] == "cuda:0"
    assert resolve({"device": " cuda , cuda:1"}, None, env={}, cuda_count=gpus(2)).devices == ("cuda:0", "cuda:1")
    with pytest.raises(SettingsError, match=r"device 'cuda,cuda:0' names one device twice \(cuda is cuda:0\)"):
        resolve({"device": "cuda,cuda:0"}, None, env={}, cuda_count=gpus(2))


def test_cpu_never_counts_gpus():
    assert resolve({"device": "cpu"}, None, env={}, cuda_count=no_probe).devices == ("cpu",)
    assert resolve({"workers": 2}, None, env={"JEVANY_DEVICE": "cpu"}, cuda_count=no_probe).worker_devices() == \
        ["cpu", "cpu"]


def test_device_auto_is_the_default_and_picks_the_first_gpu_where_one_is_visible():
    on_cpu = resolve({}, None, env={}, cuda_count=gpus(0))
    assert (on_cpu.device, on_cpu.device_auto) == ("cpu", "no CUDA device is visible")
    on_gpus = resolve({}, None, env={"JEVANY_DEVICE": "auto"}, cuda_count=gpus(2))
    assert on_gpus.devices == ("cuda:0",) and "of 2, give --device cuda:0,...,cuda:1" in on_gpus.device_auto
    assert resolve({"device_map": "auto"}, None, env={}, cuda_count=gpus(2)).devices == ("cuda",)    # all of them
    assert resolve({"device": "cpu"}, None, env={}, cuda_count=no_probe).device_auto is None     # named: no note
    with pytest.raises(SettingsError, match=r"device_map spreads one model over GPUs, and device auto found none"):
        resolve({"device_map": "auto"}, None, env={}, cuda_count=gpus(0))


def test_settings_built_directly_pick_the_auto_device_too(monkeypatch):
    from jevany_daemon.server import device_names as devices
    from jevany_daemon.server.settings import ServeSettings

    monkeypatch.setattr(devices, "visible_cuda_count", gpus(1))
    assert ServeSettings().devices == ("cuda:0",) and ServeSettings().worker_devices() == ["cuda:0"]


@pytest.mark.parametrize("device,count,message", [
    ("cuda", 0, "device 'cuda:0' needs a CUDA device, but none is visible here"),
    ("cuda:1", 0, "device 'cuda:1' needs a CUDA device"),
    ("cuda:2", 2, r"device 'cuda:2' does not exist: this host has 2 CUDA device\(s\), cuda:0..cuda:1"),
    ("cuda:0,cuda:1", 1, r"device 'cuda:1' does not exist: this host has 1 CUDA device\(s\), cuda:0$"),
])
def test_gpus_the_host_lacks_are_settings_errors(device, count, message):
    with pytest.raises(SettingsError, match=message):
        resolve({"device": device}, None, env={}, cuda_count=gpus(count))


def test_a_driver_that_does_not_answer_is_a_settings_error():
    def hung():
        raise TimeoutError("the NVIDIA driver did not say how many GPUs there are within 60s")

    with pytest.raises(SettingsError, match="device 'cuda:1' cannot be checked: the NVIDIA driver did not say"):
        resolve({"device": "cuda:1"}, None, env={}, cuda_count=hung)


def test_device_map_settings_from_every_source(tmp_path):
    toml = tmp_path / "jevany.toml"
    toml.write_text('device = ["cuda:0", "cuda:1"]\ndevice_map = "balanced"\nmax_memory_gib = 40\n')
    from_file = resolve({}, toml, env={}, cuda_count=gpus(2))
    assert (from_file.device_map, from_file.max_memory_gib) == ("balanced", 40)
    env = {"JEVANY_DEVICE": "cuda:0,cuda:1", "JEVANY_DEVICE_MAP": "sequential", "JEVANY_MAX_MEMORY_GIB": "70.5"}
    from_env = resolve({}, toml, env=env, cuda_count=gpus(2))
    assert (from_env.device_map, from_env.max_memory_gib) == ("sequential", 70.5)
    from_flags = resolve({"device_map": "auto", "max_memory_gib": 12.0}, toml, env=env, cuda_count=gpus(2))
    assert (from_flags.device_map, from_flags.max_memory_gib) == ("auto", 12.0)
    plain = resolve({}, None, env={})
    assert plain.device_map is None and plain.max_memory_gib is None


def test_a_device_map_is_one_worker_over_every_listed_gpu():
    two = resolve({"device": "cuda:0,cuda:1", "device_map": "auto", "max_memory_gib": 60.0}, None, env={},
                  cuda_count=gpus(4))
    assert two.worker_count == 1 and two.worker_devices() == ["cuda:0,cuda:1"]
    told = two.worker_settings("cuda:0,cuda:1")
    assert (told["device"], told["device_map"], told["max_memory_gib"], told["cpu_threads"]) == (
        "cuda:0,cuda:1", "auto", 60.0, None)
    every = resolve({"device": "cuda", "device_map": "balanced_low_0", "workers": 1}, None, env={},
                    cuda_count=gpus(8))
    assert every.devices == ("cuda",) and every.worker_devices() == ["cuda"]   # all GPUs, not just cuda:0


@pytest.mark.parametrize("flags,env,message", [
    ({"device": "cuda", "device_map": "everywhere"}, {},
     "device_map must be one of auto, balanced, balanced_low_0, sequential, got 'everywhere'"),
    ({"device_map": "auto", "device": "cpu"}, {}, "device_map spreads one model over GPUs, and device 'cpu' names the CPU"),
    ({"device": "cuda:0,cpu", "device_map": "auto"}, {}, "names the CPU"),
    ({"device": "cuda:0,cuda:1", "device_map": "auto", "workers": 2}, {},
     "workers must be 1 with device_map: the one worker spans every GPU in device 'cuda:0,cuda:1'"),
    ({"device": "cuda:0,cuda:1", "device_map": "auto", "workers": 3}, {}, "workers must be 1 with device_map"),
    ({"device": "cuda", "max_memory_gib": 40.0}, {}, "max_memory_gib .* needs device_map"),
    ({"device": "cuda", "device_map": "auto", "max_memory_gib": 0.0}, {}, "max_memory_gib must be a number of GiB > 0"),
    ({"device": "cuda", "device_map": "auto"}, {"JEVANY_MAX_MEMORY_GIB": "-3"}, "max_memory_gib must be a number"),
    ({"device": "cuda", "device_map": "auto"}, {"JEVANY_MAX_MEMORY_GIB": "nan"}, "max_memory_gib must be a number"),
    ({"device": "cuda", "device_map": "auto"}, {"JEVANY_MAX_MEMORY_GIB": "lots"}, "JEVANY_MAX_MEMORY_GIB"),
    ({"device": "cuda:0,cuda:2", "device_map": "auto"}, {}, "device 'cuda:2' does not exist"),
])
def test_invalid_device_map_settings(flags, env, message):
    with pytest.raises(SettingsError, match=message):
        resolve(flags, None, env=env, cuda_count=gpus(2))


def test_a_device_map_in_toml_must_be_a_name(tmp_path):
    toml = tmp_path / "jevany.toml"
    toml.write_text('device = "cuda"\ndevice_map = 1\n')
    with pytest.raises(SettingsError, match="device_map must be one of"):
        resolve({}, toml, env={}, cuda_count=gpus(1))
    toml.write_text('device = "cuda"\ndevice_map = "auto"\nmax_memory_gib = true\n')
    with pytest.raises(SettingsError, match="max_memory_gib must be a number"):
        resolve({}, toml, env={}, cuda_count=gpus(1))


def test_a_reload_may_change_the_device_map():
    running = resolve({"device": "cuda:0,cuda:1"}, None, env={}, cuda_count=gpus(2))
    fresh = resolve({"device": "cuda:0,cuda:1", "device_map": "auto", "max_memory_gib": 30.0}, None, env={},
                    cuda_count=gpus(2))
    taken, needs_restart = running.with_reloaded(fresh)
    assert (taken.device_map, taken.max_memory_gib, taken.worker_count) == ("auto", 30.0, 1)
    assert needs_restart == []


def serve(*args, env=None):
    return subprocess.run([sys.executable, "-m", "jevany_daemon", "serve", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_serve_on_cuda_without_cuda_exits_2_naming_the_setting(tmp_path):
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so the real driver probe answers 0 on every host.
    proc = serve("--model", str(tmp_path), "--device", "cuda", env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2, proc.stderr
    assert "error: --device: device 'cuda:0' needs a CUDA device, but none is visible here" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_refuses_a_device_map_on_the_cpu_with_exit_2(tmp_path):
    proc = serve("--model", str(tmp_path), "--device", "cpu", "--device-map", "auto", "--max-memory-gib", "8")
    assert proc.returncode == 2, proc.stderr
    assert "error: --device-map: device_map spreads one model over GPUs" in proc.stderr


def test_serve_help_shows_every_settings_variable_and_default_at_80_columns():
    from click.testing import CliRunner

    from jevany_daemon.cli import _with_variables, app

    command = typer_command(app)
    _with_variables(command.commands["serve"])
    result = CliRunner().invoke(command, ["serve", "--help"], terminal_width=80, prog_name="jevany-daemon")
    assert result.exit_code == 0, result.output
    text = result.output
    assert max(map(len, text.splitlines())) <= 80
    options = [p for p in command.commands["serve"].params if p.name != "help" and not p.hidden]
    for param in options:
        assert param.help and "[default:" in param.help, param.name     # every option says what it defaults to
        if param.name in set(SERVE_FIELDS) | set(ENGINE_FIELDS):
            assert f"[env: JEVANY_{param.name.upper()}]" in param.help, param.name
    flat = " ".join(text.split())
    assert "JEVANY_LOG_LEVEL" in flat and "JEVANY_CACHE_DIR" in flat
    assert "--max-state-tokens <int> Tokens the state may take" in flat


def typer_command(app):
    import typer

    return typer.main.get_command(app)


@pytest.mark.parametrize("flags,env,message", [
    ({"http": "8008"}, {}, "--http: http must be HOST:PORT"),
    ({"http": "0.0.0.0:8008"}, {}, "reachable from the network without a token"),
    ({"http_token_file": "/tmp/t"}, {}, "it needs http"),
    ({}, {"JEVANY_MEDIA_TOTAL_BYTES": "10", "JEVANY_MEDIA_MAX_BYTES": "20"},
     "media_total_bytes .10. must be at least media_max_bytes .20."),
    ({}, {"JEVANY_MEDIA_MAX_PIXELS": "0"}, "JEVANY_MEDIA_MAX_PIXELS: media_max_pixels must be an integer >= 1"),
    ({}, {"JEVANY_CHOICE_NATIVE_WEIGHT": "1.5"}, "JEVANY_CHOICE_NATIVE_WEIGHT: choice_native_weight must be"),
    ({"choice_max_tokens": 1}, {}, "--choice-max-tokens: choice_max_tokens must be an integer >= 2"),
    ({}, {"JEVANY_TEMPERATURE": "0"}, "JEVANY_TEMPERATURE: temperature must be a finite number > 0"),
    ({}, {"JEVANY_DATE_FACTS": "maybe"}, "JEVANY_DATE_FACTS"),
])
def test_jevany_serve_options_are_checked_before_loading(flags, env, message):
    with pytest.raises(SettingsError, match=message):
        resolve(flags, None, env=env)


def test_a_request_allowance_equal_to_the_per_file_cap_is_valid():
    # One file of the largest size a request may carry is a request the daemon must take, so a total equal to the
    # per-file cap is a setting, not an error; only a total below it (no file of the cap could ever fit) is refused.
    s = resolve({}, None, env={"JEVANY_MEDIA_TOTAL_BYTES": "20", "JEVANY_MEDIA_MAX_BYTES": "20"})
    assert (s.media_max_bytes, s.media_total_bytes) == (20, 20)


def test_jevany_serve_options_take_jevany_names_and_defaults(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret\n")
    (tmp_path / "head.pt").touch()           # a JevAny run directory: its native head takes the temperature
    s = resolve({"http": "0.0.0.0:8008", "http_token_file": str(token), "model": str(tmp_path)}, None,
                env={"JEVANY_DATE_FACTS": "1", "JEVANY_MEDIA_ROOT": str(tmp_path), "JEVANY_TEMPERATURE": "2"})
    assert (s.http, s.engine.date_facts, s.media_root, s.temperature) == ("0.0.0.0:8008", True, str(tmp_path), 2.0)
    assert (s.media_max_bytes, s.media_total_bytes, s.media_max_pixels, s.media_max_video_frames) == \
        (50 << 20, 100 << 20, 4096 * 4096, 3600)
    d = resolve({}, None, env={}).engine
    assert (d.choice_temperature, d.choice_native_weight, d.choice_max_tokens, d.date_facts) == \
        (None, 0.0, 16384, False)
    assert resolve({"http": "[::1]:8008"}, None, env={}).http == "[::1]:8008"     # loopback: no token needed


def test_legacy_letter_flags_are_the_choice_flags_and_both_at_once_is_refused(tmp_path):
    proc = serve("--model", str(tmp_path / "none"), "--choice-temperature", "2", "--letter-temperature", "3")
    assert proc.returncode == 2
    assert "give at most one of --choice-temperature and its legacy spelling --letter-temperature" in proc.stderr
    proc = serve("--model", str(tmp_path / "none"), "--letter-pointer-weight", "7")
    assert proc.returncode == 2
    assert "choice_native_weight must be a number from 0 to 1, got 7.0" in proc.stderr


def test_a_taken_http_port_is_a_clear_start_up_error(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = serve("--model", str(tmp_path), "--bind", f"ipc://{tmp_path}/d.sock", "--control", "",
                     "--http", f"127.0.0.1:{port}")
    assert proc.returncode == 1, proc.stderr
    assert f"cannot serve HTTP on 127.0.0.1:{port} (--http)" in proc.stderr
    assert "choose another --http" in proc.stderr and "Traceback" not in proc.stderr


def test_a_native_blend_needs_the_choice_readout_and_a_checkpoint(tmp_path):
    with pytest.raises(SettingsError, match="--choice-native-weight: choice_native_weight .* needs readout choice"):
        resolve({"choice_native_weight": 0.5, "model": str(tmp_path)}, None, env={})
    with pytest.raises(SettingsError, match="has none .no head.pt.: a plain causal LM has nothing to blend"):
        resolve({"choice_native_weight": 0.5, "readout": "choice", "model": str(tmp_path)}, None, env={})
    (tmp_path / "head.pt").write_bytes(b"")
    assert resolve({"choice_native_weight": 0.5, "readout": "choice", "model": str(tmp_path)}, None,
                   env={}).engine.choice_native_weight == 0.5


def test_a_list_flag_left_empty_leaves_the_variable_and_the_file_their_say(tmp_path):
    # The command line gives a repeatable flag that was not used as () (or []), not None: it must
    # count as not given, or every start would drop the JEVANY_BIND and TOML endpoints for the default.
    toml = tmp_path / "jevany.toml"
    toml.write_text('bind = ["ipc:///tmp/from-file.sock"]\n')
    env = {"JEVANY_BIND": "ipc:///tmp/from-env-a.sock, ipc:///tmp/from-env-b.sock"}
    assert resolve({"bind": ()}, toml, env={}).endpoints == ("ipc:///tmp/from-file.sock",)
    assert resolve({"bind": ()}, toml, env=env).endpoints == ("ipc:///tmp/from-env-a.sock",
                                                              "ipc:///tmp/from-env-b.sock")
    assert resolve({"bind": ()}, None, env=env).endpoints == ("ipc:///tmp/from-env-a.sock",
                                                              "ipc:///tmp/from-env-b.sock")
    assert resolve({"bind": ("ipc:///tmp/flag.sock",)}, toml, env=env).endpoints == ("ipc:///tmp/flag.sock",)


@pytest.mark.parametrize("flags,env,message", [
    ({"bind": ("tcp://0.0.0.0:5555",)}, {}, "without CurveZMQ"),
    ({}, {"JEVANY_BIND": "tcp://10.1.2.3:5555"}, "without CurveZMQ"),
    ({"bind": ("tcp://127.0.0.1:5555", "tcp://0.0.0.0:5556")}, {}, "tcp://0.0.0.0:5556 is reachable"),
    ({"http": "0.0.0.0:8008"}, {}, "reachable from the network without a token"),
    ({}, {"JEVANY_HTTP": "10.1.2.3:8008"}, "reachable from the network without a token"),
    ({"metrics_port": 9100, "metrics_host": "0.0.0.0"}, {}, "--insecure"),
])
def test_an_exposed_address_needs_its_override_and_is_taken_with_it(tmp_path, flags, env, message):
    with pytest.raises(SettingsError, match=message):
        resolve(flags, None, env=env)
    assert resolve({**flags, "insecure": True}, None, env=env).insecure
    if "http" in flags or "JEVANY_HTTP" in env:
        token = tmp_path / "token"
        token.write_text("secret\n")
        assert not resolve({**flags, "http_token_file": str(token)}, None, env=env).insecure
