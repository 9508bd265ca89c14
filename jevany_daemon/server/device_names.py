"""Devices as the supervisor sees them: names, how many CUDA devices exist, what each worker may see.

No torch: the supervisor counts GPUs through the CUDA driver itself (ctypes
on libcuda), and does even that in a short-lived child process, so a driver
that hangs or crashes costs a settings error, never the supervisor.

A worker sees only the GPUs it serves: CUDA_VISIBLE_DEVICES names them, and
inside the worker they are cuda:0..k-1. Ordinals here are the supervisor's
own, which already respect any CUDA_VISIBLE_DEVICES it was started with; the
worker inherits CUDA_DEVICE_ORDER too, so both count devices the same way.
"""
import ctypes
import functools
import glob
import os
import re
import subprocess
import sys
from dataclasses import dataclass

CUDA_DRIVER = "libcuda.so.1"
PROBE_TIMEOUT_S = 60.0
_CUDA = re.compile(r"cuda(?::(\d+))?")


def normalise(device: str) -> str:
    """'cuda' is 'cuda:0' (torch's current device in a fresh process), so a list can't name it twice."""
    device = device.strip()
    return "cuda:0" if device == "cuda" else device


def cuda_index(device: str) -> int | None:
    """cuda:N → N; None for cpu, and for a bare 'cuda' (every visible GPU, under a device map)."""
    match = _CUDA.fullmatch(device)
    return int(match.group(1)) if match and match.group(1) is not None else None


def is_cuda(device: str) -> bool:
    return _CUDA.fullmatch(device) is not None


# --- counting ---------------------------------------------------------------------------

def driver_device_count(library: str = CUDA_DRIVER) -> int:
    """CUDA devices the driver shows this process; 0 when there is no driver or cuInit fails."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


_PROBE = "from jevany_daemon.server.device_names import driver_device_count as f; print(f())"


@functools.cache
def cuda_device_count() -> int:
    """driver_device_count, asked of a child process, once per supervisor (the count can't change
    while CUDA_VISIBLE_DEVICES doesn't, and a reload should not pay for cuInit again).

    Raises TimeoutError when the driver does not answer: that is no answer, not zero GPUs.
    """
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the NVIDIA driver did not say how many GPUs there are within "
                           f"{PROBE_TIMEOUT_S:.0f}s") from None
    try:
        return int(proc.stdout.strip()) if proc.returncode == 0 else 0
    except ValueError:
        return 0


def visible_cuda_count() -> int:
    """cuda_device_count, without starting a probe on a host with no NVIDIA device node at all."""
    if not glob.glob("/dev/nvidia*") and not os.path.exists("/dev/dxg"):   # dxg: a GPU under WSL2
        return 0
    return cuda_device_count()


def auto_device(count: int) -> tuple[str, str]:
    """--device auto, as JevAny picks its default: (the first CUDA device where one is visible, else cpu, why)."""
    if count == 0:
        return "cpu", "no CUDA device is visible"
    more = "" if count == 1 else f"; of {count}, give --device cuda:0,...,cuda:{count - 1} for one worker each"
    return "cuda:0", f"a CUDA device is visible{more}"


def missing(devices: list[str], count: int) -> str | None:
    """Why these devices can't be had on a host with `count` CUDA devices, or None when they can."""
    wanted = [d for d in devices if is_cuda(d)]
    if not wanted:
        return None
    if count == 0:
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = "" if hidden is None else f", or CUDA_VISIBLE_DEVICES={hidden!r} hides them"
        return f"{wanted[0]!r} needs a CUDA device, but none is visible here (no NVIDIA driver or GPU{where})"
    for device in wanted:
        index = cuda_index(device)
        if index is not None and index >= count:
            return (f"{device!r} does not exist: this host has {count} CUDA device(s), "
                    f"cuda:0{'' if count == 1 else f'..cuda:{count - 1}'}")
    return None


# --- what one worker sees ---------------------------------------------------------------

@dataclass(frozen=True)
class WorkerView:
    device: str                    # the worker's own name for what it serves (cuda:0, cuda:0,cuda:1, cpu)
    cuda_visible: str | None       # CUDA_VISIBLE_DEVICES for it; None: keep the supervisor's


def worker_view(device: str, env=os.environ) -> WorkerView:
    """What a worker serving `device` (the operator's name: cpu, cuda:N, a list of them, or a bare
    cuda for every visible GPU) is told, given the supervisor's environment."""
    names = [d.strip() for d in device.split(",")]
    if names == ["cpu"]:
        return WorkerView("cpu", "")          # a CPU worker has no business with a GPU
    if names == ["cuda"]:
        return WorkerView("cuda", None)       # a device map over every GPU the supervisor sees
    physical = [_physical(cuda_index(name), env) for name in names]
    inside = ",".join(f"cuda:{i}" for i in range(len(names)))
    return WorkerView(inside, ",".join(physical))


def _physical(index: int | None, env) -> str:
    """The CUDA_VISIBLE_DEVICES entry for the supervisor's ordinal `index`: its own list's entry
    (an index, GPU-... or MIG-... UUID, kept verbatim), or the index itself when it has no list."""
    if index is None:
        raise ValueError("a device list names each GPU as cuda:N")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(index)
    entries = [e.strip() for e in visible.split(",")]
    if index >= len(entries) or not entries[index]:
        raise ValueError(f"cuda:{index} is not in CUDA_VISIBLE_DEVICES={visible!r}")
    return entries[index]
