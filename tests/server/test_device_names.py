"""Devices as the supervisor sees them: counting GPUs without torch, and what each worker is shown."""
import shutil
import subprocess

import pytest

from jevany_daemon.server import device_names
from jevany_daemon.server.device_names import WorkerView, cuda_index, missing, normalise, worker_view


def test_names():
    assert [normalise(d) for d in ("cuda", " cuda:0 ", "cuda:3", "cpu")] == ["cuda:0", "cuda:0", "cuda:3", "cpu"]
    assert [cuda_index(d) for d in ("cuda:0", "cuda:12", "cuda", "cpu")] == [0, 12, None, None]


# --- counting ---------------------------------------------------------------------------

FAKE_DRIVER = """
int cuInit(unsigned int flags) { return INIT_RESULT; }
int cuDeviceGetCount(int *count) { *count = COUNT; return COUNT_RESULT; }
"""


@pytest.fixture
def fake_driver(tmp_path):
    """fake_driver(init=0, count=2, count_result=0) -> path of a libcuda stand-in with those answers."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler to build a stand-in libcuda")

    def build(init=0, count=2, count_result=0):
        name = f"libcuda-{init}-{count}-{count_result}"
        source = tmp_path / f"{name}.c"
        source.write_text(FAKE_DRIVER.replace("INIT_RESULT", str(init)).replace("COUNT_RESULT", str(count_result))
                          .replace("COUNT", str(count)))
        library = tmp_path / f"{name}.so"
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=60)
        return str(library)

    return build


def test_the_driver_is_asked_through_cuinit_and_cudevicegetcount(fake_driver):
    assert device_names.driver_device_count(fake_driver(count=2)) == 2
    assert device_names.driver_device_count(fake_driver(count=8)) == 8
    assert device_names.driver_device_count(fake_driver(init=100)) == 0           # CUDA_ERROR_NO_DEVICE
    assert device_names.driver_device_count(fake_driver(count=3, count_result=999)) == 0


def test_no_driver_library_is_no_gpu(tmp_path):
    assert device_names.driver_device_count(str(tmp_path / "libcuda.so.1")) == 0


@pytest.mark.parametrize("probe,count", [
    ("print(3)", 3),
    ("raise SystemExit(1)", 0),                              # a child that fails counts nothing
    ("print('no idea')", 0),
])
def test_the_count_comes_from_a_child_process(monkeypatch, probe, count):
    monkeypatch.setattr(device_names, "_PROBE", probe)
    assert device_names.cuda_device_count.__wrapped__() == count


def test_a_hung_driver_is_no_answer_rather_than_no_gpu(monkeypatch):
    monkeypatch.setattr(device_names, "_PROBE", "import threading; threading.Event().wait()")
    monkeypatch.setattr(device_names, "PROBE_TIMEOUT_S", 1.0)
    with pytest.raises(TimeoutError, match="did not say how many GPUs there are within 1s"):
        device_names.cuda_device_count.__wrapped__()


def test_the_real_probe_respects_cuda_visible_devices():
    code = "from jevany_daemon.server.device_names import cuda_device_count as f; print(f())"
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([device_names.sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0"


def test_why_devices_are_missing(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert missing(["cpu"], 0) is None
    assert missing(["cuda:0", "cuda:1"], 2) is None
    assert missing(["cuda"], 1) is None
    assert missing(["cuda:0"], 0) == "'cuda:0' needs a CUDA device, but none is visible here (no NVIDIA driver or GPU)"
    assert missing(["cuda:0", "cuda:4"], 4) == "'cuda:4' does not exist: this host has 4 CUDA device(s), cuda:0..cuda:3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert missing(["cuda"], 0).endswith("or CUDA_VISIBLE_DEVICES='' hides them)")


# --- what a worker sees -----------------------------------------------------------------

@pytest.mark.parametrize("device,env,seen", [
    ("cpu", {}, WorkerView("cpu", "")),
    ("cpu", {"CUDA_VISIBLE_DEVICES": "0,1"}, WorkerView("cpu", "")),
    ("cuda:0", {}, WorkerView("cuda:0", "0")),
    ("cuda:1", {}, WorkerView("cuda:0", "1")),
    ("cuda:1", {"CUDA_VISIBLE_DEVICES": "2,3"}, WorkerView("cuda:0", "3")),
    ("cuda:1", {"CUDA_VISIBLE_DEVICES": " 2 , 3 "}, WorkerView("cuda:0", "3")),
    ("cuda:1", {"CUDA_VISIBLE_DEVICES": "GPU-8f2c1a0e-aaaa,MIG-4d5e-bbbb"}, WorkerView("cuda:0", "MIG-4d5e-bbbb")),
    ("cuda:0,cuda:2", {}, WorkerView("cuda:0,cuda:1", "0,2")),
    ("cuda:0,cuda:2", {"CUDA_VISIBLE_DEVICES": "4,5,6"}, WorkerView("cuda:0,cuda:1", "4,6")),
    ("cuda", {"CUDA_VISIBLE_DEVICES": "5,7"}, WorkerView("cuda", None)),   # a device map over all of them
])
def test_each_worker_sees_only_the_gpus_it_serves(device, env, seen):
    assert worker_view(device, env) == seen


def test_a_gpu_outside_the_supervisors_list_is_refused():
    with pytest.raises(ValueError, match="cuda:2 is not in CUDA_VISIBLE_DEVICES='0,1'"):
        worker_view("cuda:2", {"CUDA_VISIBLE_DEVICES": "0,1"})
