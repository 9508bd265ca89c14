"""What a worker reports about its device(s): the CPU for real, CUDA with the driver's answers faked."""
import mmap
import platform

import pytest
import torch

from jevany_daemon.model import device_reports
from jevany_daemon.model.device_reports import cpu_name, device_report, devices_report

GIB = 1 << 30


def test_a_cpu_report_is_this_process_on_this_host():
    report = device_report(torch.device("cpu"))
    assert set(report) == {"name", "memory_used_bytes", "memory_total_bytes", "memory_peak_bytes"}
    assert isinstance(report["name"], str) and report["name"]
    assert 0 < report["memory_used_bytes"] < report["memory_total_bytes"]
    assert report["memory_used_bytes"] <= report["memory_peak_bytes"] < report["memory_total_bytes"]
    # 64 MiB more resident memory, touched. A fresh mapping, not the heap: malloc may hand back pages
    # a freed tensor left resident, which would not grow the process at all.
    with mmap.mmap(-1, 64 << 20) as grown:
        for at in range(0, len(grown), mmap.PAGESIZE):
            grown[at] = 1
        assert device_report("cpu")["memory_used_bytes"] >= report["memory_used_bytes"] + (48 << 20)


def test_the_cpu_name_comes_from_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n")
    assert cpu_name.__wrapped__(str(x86)) == "AMD EPYC 7B13 64-Core Processor"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n")   # no model name line
    assert cpu_name.__wrapped__(str(arm)) == (platform.processor() or platform.machine() or "cpu")
    assert cpu_name.__wrapped__(str(tmp_path / "missing")) == (platform.processor() or platform.machine() or "cpu")


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two H200s as torch.cuda would describe them, 12 and 40 GiB in use."""
    free = {0: 128 * GIB, 1: 100 * GIB}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (free[torch.device(d).index], 140 * GIB))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: (torch.device(d).index + 1) * 10 * GIB)
    return free


def test_a_cuda_report_is_the_whole_devices_memory(fake_gpus):
    assert device_report(torch.device("cuda", 1)) == {
        "name": "NVIDIA H200", "memory_used_bytes": 40 * GIB, "memory_total_bytes": 140 * GIB,
        "memory_peak_bytes": 20 * GIB,
    }


def test_a_spread_model_reports_its_devices_summed_and_each(fake_gpus):
    report = devices_report([torch.device("cuda", 0), torch.device("cuda", 1)])
    assert report["name"] == "2 x NVIDIA H200"
    assert (report["memory_used_bytes"], report["memory_total_bytes"], report["memory_peak_bytes"]) == (
        52 * GIB, 280 * GIB, 30 * GIB)
    assert [d["memory_used_bytes"] for d in report["devices"]] == [12 * GIB, 40 * GIB]
    assert devices_report([torch.device("cuda", 1)]) == device_report(torch.device("cuda", 1))


def test_unknown_figures_stay_unknown_in_a_sum(monkeypatch):
    monkeypatch.setattr(device_reports, "_resident_bytes", lambda: None)
    # Any device but CUDA is reported as the host, so cpu and meta make two reports with an unknown figure.
    report = devices_report([torch.device("cpu"), torch.device("meta")])
    assert report["memory_used_bytes"] is None and report["memory_total_bytes"] > 0
