"""Where a model's weights go: one device, or spread over several GPUs by Accelerate's device map.

Without a device map the model loads and moves whole to one device. With one,
from_pretrained places each layer itself (device_map=, max_memory=) and the
model must never be moved afterwards. The budget names only the GPUs the
caller gave, so a model that does not fit is refused (check_placed) instead
of being offloaded to the CPU or disk, where it would serve at a crawl.

Inputs go where the embedding is; outputs come out where the final norm is
(the decoder's last module). Those differ on a spread model, and the
DecisionModel records both.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from jevany_daemon.config import DEVICE_MAPS
from jevany_daemon.model.checkpoint import ModelLoadError

GIB = 1 << 30
_CUDA = re.compile(r"cuda(?::(\d+))?")


@dataclass(frozen=True)
class Placement:
    device: torch.device                  # whole-model device; under a map, the first GPU (until loaded)
    device_map: str | dict | None = None
    max_memory: dict | None = None        # {GPU index or "cpu": bytes}, only the devices the map may use

    @property
    def mapped(self) -> bool:
        return self.device_map is not None

    @property
    def move_to(self) -> torch.device | None:
        """Where to move a loaded module; None when the map already put it in place."""
        return None if self.mapped else self.device

    def from_pretrained_kwargs(self) -> dict:
        return {"device_map": self.device_map, "max_memory": self.max_memory} if self.mapped else {}

    def settle(self, causal_lm, source: str) -> dict:
        """DecisionModel's device, output_device and devices for a loaded model; refuses an offloaded one."""
        if not self.mapped:
            return {"device": self.device, "output_device": self.device, "devices": (self.device,)}
        check_placed(causal_lm, self, source)
        return {"device": input_device(causal_lm), "output_device": output_device(causal_lm),
                "devices": model_devices(causal_lm)}


def plan(device: str, device_map: str | dict | None, max_memory_gib: float | None, *,
         gpu_count: Callable[[], int] = torch.cuda.device_count,
         free_bytes: Callable[[int | str], int] | None = None) -> Placement:
    """A device map over `device`: cuda (every visible GPU), cuda:N, cuda:N,cuda:M..., or cpu.

    max_memory_gib caps each device; by default each may take what is free on it.
    A dict device_map is passed on as it is (the caller placed the modules).
    """
    if isinstance(device_map, dict):
        first = next(iter(device_map.values()), "cpu")
        return Placement(torch.device(f"cuda:{first}" if isinstance(first, int) else first), device_map)
    if device_map not in DEVICE_MAPS:
        raise ModelLoadError(f"unknown device_map {device_map!r}; expected one of {', '.join(DEVICE_MAPS)}")
    if max_memory_gib is not None and not (isinstance(max_memory_gib, (int, float)) and not isinstance(
            max_memory_gib, bool) and math.isfinite(max_memory_gib) and max_memory_gib > 0):
        raise ModelLoadError(f"max_memory_gib must be a positive number of GiB, got {max_memory_gib!r}")
    free_bytes = free_bytes or _free_bytes
    names = [d.strip() for d in str(device).split(",")]
    if names == ["cpu"]:
        # Only for in-process callers and tests: the daemon refuses a device map on the CPU.
        return Placement(torch.device("cpu"), device_map, {"cpu": _budget(max_memory_gib, free_bytes, "cpu")})
    indices = gpu_indices(names, gpu_count())
    memory = {i: _budget(max_memory_gib, free_bytes, i) for i in indices}
    return Placement(torch.device("cuda", indices[0]), device_map, memory)


def gpu_indices(names: list[str], visible: int) -> list[int]:
    """['cuda'] → every visible GPU; ['cuda:0', 'cuda:2'] → [0, 2], each checked against what is visible."""
    indices = []
    for name in names:
        match = _CUDA.fullmatch(name)
        if match is None:
            raise ModelLoadError(f"unknown device {name!r} for a device map; expected cpu, cuda or a list "
                                 "such as cuda:0,cuda:1")
        if visible == 0:
            raise ModelLoadError(f"device {name!r} requested but CUDA is not available to this process")
        if match.group(1) is None:
            indices += range(visible)
            continue
        index = int(match.group(1))
        if index >= visible:
            raise ModelLoadError(f"device {name!r} requested but only {visible} CUDA device(s) are visible")
        indices.append(index)
    if len(set(indices)) != len(indices):
        raise ModelLoadError(f"device {','.join(names)!r} names one GPU twice")
    return indices


def _budget(max_memory_gib: float | None, free_bytes, device: int | str) -> int:
    return int(max_memory_gib * GIB) if max_memory_gib is not None else free_bytes(device)


def _free_bytes(device: int | str) -> int:
    if device == "cpu":
        import psutil    # Accelerate's own dependency, and its measure of free host memory

        return psutil.virtual_memory().available
    return torch.cuda.mem_get_info(device)[0]


# -- after loading ---------------------------------------------------------------------------

def input_device(causal_lm) -> torch.device:
    return causal_lm.get_input_embeddings().weight.device


def output_device(causal_lm) -> torch.device:
    """Where the decoder's final hidden states come out: its final norm, else its last parameter."""
    decoder = causal_lm.get_decoder()
    norm = getattr(decoder, "norm", None)
    params = list(norm.parameters()) if isinstance(norm, torch.nn.Module) else []
    return (params or list(decoder.parameters()))[-1].device


def model_devices(causal_lm) -> tuple[torch.device, ...]:
    """Every device holding a parameter, in the order the model first uses them."""
    return tuple(dict.fromkeys(p.device for p in causal_lm.parameters()))


def check_placed(causal_lm, placement: Placement, source: str) -> None:
    """Refuse a model the map could not fit: what did not fit is on the meta device (offloaded to disk)
    or on a device the budget did not name."""
    allowed = {_device(k) for k in placement.max_memory or {}}
    left = 0
    for param in causal_lm.parameters():
        if param.device.type == "meta" or (allowed and param.device not in allowed):
            left += param.numel() * param.element_size()
    if left:
        budget = ", ".join(f"{_name(k)}: {v / GIB:.2f} GiB" for k, v in (placement.max_memory or {}).items())
        raise ModelLoadError(
            f"{source!r} does not fit the memory the device map may use ({budget}); {left / GIB:.2f} GiB of "
            "weights were left over. Give more GPUs, a higher --max-memory-gib, or a smaller --dtype"
        )


def _device(key: int | str) -> torch.device:
    return torch.device("cuda", key) if isinstance(key, int) else torch.device(key)


def _name(key: int | str) -> str:
    return f"cuda:{key}" if isinstance(key, int) else str(key)
