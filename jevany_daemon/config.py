"""Engine and loading settings: frozen dataclasses, validated on construction so a bad value fails before
weights load. No torch: the supervisor checks them."""
import math
import os
from dataclasses import dataclass

LAYOUTS = ("auto", "rows", "packed", "shared")
# torch.compile's modes, as JevAny's JEVANY_COMPILE names them (its "1" means reduce-overhead).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
BATCH_POLICIES = ("adaptive", "greedy")
# Accelerate's placement strategies for one model over several GPUs (--device-map);
# here, without torch, so the supervisor checks the setting and the worker uses it.
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


# A CPU computes every padded token, so padding costs what real tokens cost,
# while one more pass costs little: on a 2-core machine, short requests handed
# over 32 at a time scored at 125 req/s under a 0.5 cap and 204 under 0.1
# (benchmarks/inprocess.py --workload short --n 256 --batch 32 --chunks
# --max-padding-waste 0.5, then 0.1). A GPU pads nearly for free and pays per
# pass instead, so it keeps the looser cap.
CPU_PADDING_WASTE = 0.1
GPU_PADDING_WASTE = 0.5


def default_padding_waste(device_type: str) -> float:
    return CPU_PADDING_WASTE if device_type == "cpu" else GPU_PADDING_WASTE


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 1          # 1 = every request scored alone (the seed's default)
    max_packed_tokens: int = 8192    # padded tokens one forward pass may allocate
    max_state_tokens: int = 8192     # capped by the model's context window
    max_branch_tokens: int = 8192    # state + one question's branch; capped likewise
    layout: str = "auto"             # auto: packed, else shared, where proven equal to rows; else rows
    # Padding a batch may waste, as a fraction of its padded tokens. A request
    # joins a batch only while the batch stays under this; the oldest request
    # always goes, so nothing starves. 1.0 disables the check. None: the
    # device's default (default_padding_waste).
    max_padding_waste: float | None = None
    # adaptive: batch a width class only while batched passes measure at least
    # as fast per token as single ones (engine/policy.py); greedy: always batch.
    batch_policy: str = "adaptive"
    # The prefix cache (JevAny's names and default): states kept, the shortest
    # state worth keeping, and a bound in bytes so a cache on a GPU cannot
    # starve the batches. 0 turns it off, the prompt's kept head included.
    prefix_cache: int = 4
    prefix_min_tokens: int = 384
    prefix_cache_bytes: int = 1 << 30
    # JevAny's serve options, same names and defaults. date_facts: every pair of
    # absolute dates in the state, as one sentence each, added to the state
    # (JEVANY_DATE_FACTS=1). The choice readout's temperature (None: the
    # model's), its log-linear blend with the checkpoint's native readout
    # (0: none), and its longest prompt, the one-token answer included.
    date_facts: bool = False
    choice_temperature: float | None = None
    choice_native_weight: float = 0.0
    choice_max_tokens: int = 16_384
    # The shape plan (engine/shape_plan.py, replay.py): passes padded to a fixed set of shapes, every one
    # run before the worker is ready. shape_plan alone runs them eagerly; compile (one of COMPILE_MODES)
    # through torch.compile; cuda_graphs as CUDA graphs captured at start, up to cuda_graph_max_tokens
    # padded tokens a pass (None: max_packed_tokens). Either turns the plan on; they do not combine.
    # warmup_limit: seconds warming the plan may take before the start fails.
    shape_plan: bool = False
    compile: str | None = None
    cuda_graphs: bool = False
    cuda_graph_max_tokens: int | None = None
    warmup_limit: float = 600.0

    @property
    def runner(self) -> str | None:
        """How planned passes run (replay.RUNNERS), or None: no plan, every pass as it comes."""
        if self.compile is not None:
            return "compiled"
        if self.cuda_graphs:
            return "graphs"
        return "eager" if self.shape_plan else None

    def __post_init__(self):
        for name in ("max_batch_size", "max_packed_tokens", "max_state_tokens", "max_branch_tokens",
                     "prefix_cache_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("prefix_cache", "prefix_min_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.batch_policy not in BATCH_POLICIES:
            raise ValueError(f"batch_policy must be one of {', '.join(BATCH_POLICIES)}, got {self.batch_policy!r}")
        if self.max_padding_waste is not None and not 0.0 <= self.max_padding_waste <= 1.0:
            raise ValueError(f"max_padding_waste must be between 0 and 1, got {self.max_padding_waste!r}")
        if not isinstance(self.date_facts, bool):
            raise ValueError(f"date_facts must be true or false, got {self.date_facts!r}")
        t = self.choice_temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
                              or t <= 0):
            raise ValueError(f"choice_temperature must be a finite number > 0, got {t!r}")
        w = self.choice_native_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0:
            raise ValueError(f"choice_native_weight must be a number from 0 to 1, got {w!r}")
        m = self.choice_max_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 2:
            raise ValueError(f"choice_max_tokens must be an integer >= 2, got {m!r}")
        for name in ("shape_plan", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be 0, 1 or one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.compile is not None and self.cuda_graphs:
            raise ValueError("compile cannot be combined with cuda_graphs (as in JevAny): each captures the "
                             "passes its own way; give one of them")
        g = self.cuda_graph_max_tokens
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
            raise ValueError(f"cuda_graph_max_tokens must be an integer >= 1, got {g!r}")
        w = self.warmup_limit
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"warmup_limit must be a number of seconds > 0, got {w!r}")


# JevAny's JEVANY_ATTN picks an attention backend; the layouts' masks (block-causal,
# restarting positions, kept prefixes) are built and tested for sdpa alone.
ATTN_IMPLEMENTATIONS = ("sdpa",)
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


@dataclass(frozen=True)
class LoadOptions:
    """How a JevAny checkpoint becomes a model: JevAny's load options (its checkpoint.py LoadOptions), under
    its names and defaults. from_env reads its variables."""
    lora_scale: float = 1.0       # the adapter's update times this: 0 is the base model, 1 the trained one
    merge: bool = True            # fold the LoRA into the base weights (in FP32, then cast)
    # A checkpoint trained on a BF16 backbone serves in BF16 with its adapter kept apart,
    # unless this allows the faster, slightly approximate merge (JevAny's docs recommend it).
    merge_bf16: bool = False
    attn: str | None = None       # attention backend; None: sdpa, the only one served
    base_load_path: str | None = None   # a local copy of the base model, read in place of head.pt's base

    def __post_init__(self):
        s = self.lora_scale
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            raise ValueError(f"lora_scale must be a finite number, got {s!r}")
        for name in ("merge", "merge_bf16"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.attn is not None and self.attn not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn must be sdpa, got {self.attn!r}: the daemon's layouts are built and tested "
                             "on sdpa attention alone; unset it or set sdpa")
        if self.base_load_path is not None and not (isinstance(self.base_load_path, str) and self.base_load_path):
            raise ValueError(f"base_load_path must be a directory, got {self.base_load_path!r}")

    @classmethod
    def from_env(cls, env=os.environ) -> "LoadOptions":
        """JevAny's variables: JEVANY_LORA_SCALE, _MERGE, _MERGE_BF16, _ATTN and _BASE_LOAD_PATH."""
        found = {}
        for name, parse in (("lora_scale", float), ("merge", _flag), ("merge_bf16", _flag), ("attn", str),
                            ("base_load_path", str)):
            raw = env.get(f"JEVANY_{name.upper()}")
            if raw:
                try:
                    found[name] = parse(raw)
                except ValueError:
                    raise ValueError(f"JEVANY_{name.upper()}: {raw!r} is not a valid {name}") from None
        return cls(**found)


def compile_mode(raw) -> str | None:
    """JevAny's JEVANY_COMPILE spelling → a mode or None: 0/false/off/no/empty off, 1/true/on/yes its
    reduce-overhead, else the mode named (refused later if it is none of COMPILE_MODES)."""
    if raw is None:
        return None
    value = str(raw).strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return None
    return "reduce-overhead" if value in ("1", "true", "on", "yes") else value


def _flag(raw: str) -> bool:
    if raw.lower() not in _TRUE + _FALSE:
        raise ValueError(raw)
    return raw.lower() in _TRUE
