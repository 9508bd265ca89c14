"""Which SDPA kernel torch picks for each kind of mask and dtype, and what it gives a query with no key.

The layouts pass attention an additive float mask (never boolean: see
engine/layouts.py) and make sure no query row is left without a key,
because CUDA's memory-efficient kernel returns NaN for such a row where the
CPU's returns zeros (engine/masks.py). This records, on the device at hand,
the kernel chosen for no mask (causal), an additive float mask and a
boolean one, per dtype, and what comes out for a row whose every key is
masked: "nan", "zeros" or "finite" (something else). The kernel depends on
the head size too (cuDNN's and flash's limits), so gpu-check probes at the
checked model's heads and head size.

"kernel" is what serves under the engine's own settings (a model on CUDA
turns cuDNN's attention off: model/kernels.py), and the dead row is that
kernel's; "torch_default" is what torch alone would pick.
"""
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from jevany_daemon.model import kernels

SHAPE = (2, 4, 16, 64)       # batch, heads, positions, head_dim: the tiny models' heads
DEAD = (0, 0, 5)             # the query row left with no key
EVERY_KERNEL = [b for b in SDPBackend.__members__.values() if b is not SDPBackend.ERROR]


def _kernel(q, k, v, mask, causal: bool) -> str:
    try:
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, causal)
        return next((name for name, value in SDPBackend.__members__.items() if int(value) == choice), str(choice))
    except (AttributeError, RuntimeError, TypeError) as exc:     # private API: say so rather than fail
        return f"unknown ({type(exc).__name__})"


def _dead_row(out: torch.Tensor) -> str:
    row = out[DEAD].float()
    if torch.isnan(row).any():
        return "nan"
    return "zeros" if torch.equal(row, torch.zeros_like(row)) else "finite"


def probe(device: str, dtypes=(torch.float32, torch.bfloat16), shape=SHAPE) -> list[dict]:
    rows = []
    generator = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        q, k, v = (torch.randn(shape, generator=generator).to(device=device, dtype=dtype) for _ in range(3))
        b, _, n, _ = shape
        allowed = torch.ones((b, 1, n, n), dtype=torch.bool, device=device).tril()
        allowed[DEAD[0], 0, DEAD[2]] = False
        additive = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
        for kind, mask, causal in (("none (causal)", None, True), ("additive float 4D", additive, False),
                                   ("boolean 4D", allowed, False)):
            with as_served(device):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
                kernel = _kernel(q, k, v, mask, causal)
            with sdpa_kernel(EVERY_KERNEL):       # torch's defaults, whatever this process turned off
                default = _kernel(q, k, v, mask, causal)
            rows.append({"dtype": str(dtype).removeprefix("torch."), "mask": kind, "kernel": kernel,
                         "torch_default": default,
                         "row_without_a_key": "n/a" if mask is None else _dead_row(out)})
    return rows


@contextmanager
def as_served(device: str):
    """The engine's process-wide attention settings for a while, then torch's as they were."""
    cudnn = torch.backends.cuda.cudnn_sdp_enabled()
    kernels.no_cudnn_attention(torch.device(device))
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn)


def print_probe(rows: list[dict]) -> None:
    for r in rows:
        print(f"  sdpa {r['dtype']:8} {r['mask']:18} kernel {r['kernel']:20} row without a key: "
              f"{r['row_without_a_key']:5}  (torch's own pick: {r['torch_default']})")
