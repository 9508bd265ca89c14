"""What a worker says about the device(s) its model lives on: name, memory in use, memory in total.

Cheap enough for every results message: a CUDA report is one cudaMemGetInfo
call, a CPU report one small read of /proc through a descriptor kept open.

On CUDA, "used" is the whole device's (total minus free, from
torch.cuda.mem_get_info), not torch.cuda.memory_allocated: the operator asks
how full the GPU is, and that includes the CUDA context, the blocks torch's
caching allocator holds but has not handed out, and any other process on the
same GPU, none of which memory_allocated counts. The peak is this process's
(torch.cuda.max_memory_reserved): the most its allocator ever took.

On the CPU, "used" is this process's resident memory and "total" the host's
physical memory: a CPU worker shares the host, so the device-wide figure
would mostly describe other processes.
"""
import functools
import os
import platform
import resource

import torch


def device_report(device: torch.device) -> dict:
    """{"name", "memory_used_bytes", "memory_total_bytes", "memory_peak_bytes"}; a value is None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_report(device)
    return _cpu_report()


def devices_report(devices) -> dict:
    """One report for a model on one device or spread over several (summed, each device listed too)."""
    devices = list(dict.fromkeys(torch.device(d) for d in devices))
    if len(devices) == 1:
        return device_report(devices[0])
    each = [device_report(d) for d in devices]
    names = list(dict.fromkeys(r["name"] for r in each))
    return {
        "name": f"{len(each)} x {names[0]}" if len(names) == 1 else " + ".join(map(str, names)),
        "memory_used_bytes": _sum(r["memory_used_bytes"] for r in each),
        "memory_total_bytes": _sum(r["memory_total_bytes"] for r in each),
        "memory_peak_bytes": _sum(r["memory_peak_bytes"] for r in each),
        "devices": each,
    }


def _sum(values) -> int | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def _cuda_report(device: torch.device) -> dict:
    free, total = torch.cuda.mem_get_info(device)
    return {
        "name": torch.cuda.get_device_name(device),
        "memory_used_bytes": total - free,
        "memory_total_bytes": total,
        "memory_peak_bytes": torch.cuda.max_memory_reserved(device),
    }


def _cpu_report() -> dict:
    used = _resident_bytes()
    # ru_maxrss is in KiB on Linux, and the kernel updates it lazily: it can trail the current figure.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "name": cpu_name(),
        "memory_used_bytes": used,
        "memory_total_bytes": _physical_bytes(),
        "memory_peak_bytes": max(peak, used or 0),
    }


@functools.cache
def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name ("AMD EPYC 7B13 64-Core Processor"), else what platform knows."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


@functools.cache
def _open_statm(statm: str) -> int:
    # Held open for the process's life: opening it per report would show up as a
    # descriptor that comes and goes with every results message.
    return os.open(statm, os.O_RDONLY | os.O_CLOEXEC)


def _resident_bytes(statm: str = "/proc/self/statm") -> int | None:
    try:
        return int(os.pread(_open_statm(statm), 256, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _physical_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None
