"""JevAny's serve options and variables: each does what it does in JevAny, or is refused before loading."""
import pytest

from jevany_daemon.server.jevany_options import OptionError, http_from_host_port
from jevany_daemon.server.settings import SettingsError, resolve

from .test_settings import gpus, serve


@pytest.fixture
def run_dir(tmp_path):
    """A directory settings take for a JevAny run (it has a head.pt); nothing here loads it."""
    (tmp_path / "head.pt").touch()
    return str(tmp_path)


@pytest.mark.parametrize("env,message", [
    ({"JEVANY_CUDA_GRAPHS": "1"}, "^JEVANY_CUDA_GRAPHS: cuda_graphs captures CUDA graphs and needs CUDA devices; "
                                  "device is cpu"),
    ({"JEVANY_COMPILE": "fast"}, "^JEVANY_COMPILE: compile must be 0, 1 or one of default, reduce-overhead"),
    ({"JEVANY_COMPILE": "1", "JEVANY_CUDA_GRAPHS": "1"}, "compile cannot be combined with cuda_graphs"),
    ({"JEVANY_FUSED_KERNELS": "1"}, "JEVANY_FUSED_KERNELS=1: JevAny's fused Qwen3.5 kernels are not available"),
    ({"JEVANY_CUDA_GRAPH_MAX_TOKENS": "0"}, "^JEVANY_CUDA_GRAPH_MAX_TOKENS: cuda_graph_max_tokens must be an integer "
                                            ">= 1, got 0"),
    ({"JEVANY_LORA_SCALE": "nan"}, "JEVANY_LORA_SCALE: lora_scale must be a finite number"),
    ({"JEVANY_MERGE": "sometimes"}, "JEVANY_MERGE: 'sometimes' is not a valid merge"),
    ({"JEVANY_ATTN": "eager"}, "JEVANY_ATTN: attn must be sdpa, got 'eager'"),
    ({"JEVANY_BASE_LOAD_PATH": "/nowhere/base"}, "JEVANY_BASE_LOAD_PATH: base_load_path /nowhere/base is not a dir"),
])
def test_what_jevany_would_do_and_the_daemon_cannot_is_refused_naming_the_variable(env, message):
    with pytest.raises(SettingsError, match=message):
        resolve({"device": "cpu"}, None, env=env)


def test_jevany_load_variables_reach_the_load_options_and_what_jevany_leaves_off_stays_off(tmp_path):
    env = {"JEVANY_LORA_SCALE": "0.5", "JEVANY_MERGE": "0", "JEVANY_MERGE_BF16": "1", "JEVANY_ATTN": "sdpa",
           "JEVANY_BASE_LOAD_PATH": str(tmp_path),
           # off, or sizing nothing without CUDA graphs: as in JevAny
           "JEVANY_CUDA_GRAPHS": "0", "JEVANY_COMPILE": "off", "JEVANY_FUSED_KERNELS": "0",
           "JEVANY_CUDA_GRAPH_MAX_TOKENS": "4096"}
    engine = resolve({"device": "cpu"}, None, env=env).engine
    assert (engine.cuda_graphs, engine.compile, engine.runner, engine.cuda_graph_max_tokens) == (False, None, None, 4096)
    load = resolve({"device": "cpu"}, None, env=env).load
    assert (load.lora_scale, load.merge, load.merge_bf16, load.attn, load.base_load_path) == \
        (0.5, False, True, "sdpa", str(tmp_path))
    assert resolve({"device": "cpu", "merge": True}, None, env=env).load.merge is True     # a flag wins
    default = resolve({"device": "cpu"}, None, env={}).load
    assert (default.lora_scale, default.merge, default.merge_bf16, default.attn) == (1.0, True, False, None)
    assert resolve({"device": "cpu"}, None, env={}).dtype is None        # the checkpoint's


@pytest.mark.parametrize("value,mode", [("1", "reduce-overhead"), ("true", "reduce-overhead"), ("default", "default"),
                                        ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs"), ("0", None),
                                        ("off", None)])
def test_jevany_compile_takes_jevanys_values(value, mode):
    engine = resolve({"device": "cpu"}, None, env={"JEVANY_COMPILE": value}).engine
    assert engine.compile == mode and engine.runner == ("compiled" if mode else None)
    assert resolve({"device": "cpu", "compile": "0"}, None, env={"JEVANY_COMPILE": value}).engine.compile is None


def test_jevany_cuda_graphs_capture_on_a_gpu_and_their_token_bound_sizes_them():
    env = {"JEVANY_CUDA_GRAPHS": "1", "JEVANY_CUDA_GRAPH_MAX_TOKENS": "2048"}
    engine = resolve({"device": "cuda"}, None, env=env, cuda_count=gpus(1)).engine
    assert (engine.cuda_graphs, engine.cuda_graph_max_tokens, engine.runner) == (True, 2048, "graphs")
    with pytest.raises(SettingsError, match="^JEVANY_CUDA_GRAPHS: cuda_graphs needs the whole model on one GPU"):
        resolve({"device": "cuda:0,cuda:1", "device_map": "auto"}, None, env=env, cuda_count=gpus(2))


def test_readout_names_native_and_letter(run_dir):
    assert resolve({"readout": "letter", "device": "cpu"}, None, env={}).readout == "choice"
    assert resolve({"readout": "native", "model": run_dir, "device": "cpu"}, None, env={}).readout == "native"
    with pytest.raises(SettingsError, match="^--readout: readout native reads a JevAny checkpoint's own head, and "
                                            "the demo model is a plain causal LM"):
        resolve({"readout": "native"}, None, env={})


def test_jevany_temperature_is_the_native_heads_and_refused_with_the_choice_readout(run_dir):
    assert resolve({"model": run_dir}, None, env={"JEVANY_TEMPERATURE": "2"}).temperature == 2.0
    for flags in ({"model": run_dir, "readout": "choice"}, {}):       # the demo model reads by choice
        with pytest.raises(SettingsError, match="^JEVANY_TEMPERATURE: temperature applies to a checkpoint's native "
                                                "head.*give --choice-temperature"):
            resolve(flags, None, env={"JEVANY_TEMPERATURE": "2"})


def test_mps_is_refused_naming_what_to_give():
    with pytest.raises(SettingsError, match=r"^--device: device mps .* give --device cpu, or cuda"):
        resolve({"device": "mps"}, None, env={}, cuda_count=gpus(0))


def test_cors_origins_every_one_by_default_a_list_or_none():
    assert resolve({}, None, env={}).http_cors_origins == "*"
    for value in ("", "https://app.example:8443,http://[::1]:3000"):
        assert resolve({"http_cors_origins": value}, None, env={}).http_cors_origins == value
    with pytest.raises(SettingsError, match="^JEVANY_HTTP_CORS_ORIGINS: http_cors_origins must be"):
        resolve({}, None, env={"JEVANY_HTTP_CORS_ORIGINS": "app.example/path"})


def test_host_and_port_are_jevanys_http():
    assert http_from_host_port(None, None, "127.0.0.1:9") == "127.0.0.1:9"
    assert http_from_host_port(None, 9000, None) == "127.0.0.1:9000"
    assert http_from_host_port("::1", None, None) == "[::1]:8008"
    with pytest.raises(OptionError, match="not both"):
        http_from_host_port("0.0.0.0", 80, "127.0.0.1:9")


def test_jevany_serve_flags_on_the_command_line(tmp_path):
    # JevAny's names for ours: refused with the name of the setting they fill
    proc = serve("--run", str(tmp_path / "missing"), "--model-name", "x", "--prefix-cache-size", "0")
    assert (proc.returncode, proc.stderr.strip()) == (2, f"error: --model: model does not exist: {tmp_path}/missing")
    proc = serve("--checkpoint", str(tmp_path), "--port", "70000")
    assert "error: --http: http must be HOST:PORT such as 127.0.0.1:8008, got '127.0.0.1:70000'" in proc.stderr
    proc = serve("--model", str(tmp_path), "--device", "cpu", "--cuda-graphs")
    assert proc.returncode == 2 and "error: --cuda-graphs: cuda_graphs captures CUDA graphs and needs CUDA" in proc.stderr
    proc = serve("--model", str(tmp_path), "--readout", "native")
    assert proc.returncode == 2 and "readout native reads a JevAny checkpoint's own head" in proc.stderr
