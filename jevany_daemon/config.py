"""Engine and loading settings: frozen dataclasses, validated on construction so a bad value fails before
weights load. Each field declares its setting once (declaration.py): the serve command's flags, its
JEVANY_* variables, the TOML file and the docs' table are built from these. No torch: the supervisor
checks them."""
import os
from dataclasses import dataclass

from jevany_daemon.declaration import (Rule, check, declared, finite, fraction, integer, number, one_of,
                                       read_environment, reloadable)

LAYOUTS = ("auto", "rows", "packed", "shared")
# torch.compile's modes, as JevAny's JEVANY_COMPILE names them (its "1" means reduce-overhead).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
BATCH_POLICIES = ("adaptive", "greedy")
THREAD_POLICIES = ("adaptive", "fixed")
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


def compile_mode(raw) -> str | None:
    """JevAny's JEVANY_COMPILE spelling → a mode or None: 0/false/off/no/empty off, 1/true/on/yes its
    reduce-overhead, else the mode named (refused later if it is none of COMPILE_MODES)."""
    if raw is None:
        return None
    value = str(raw).strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return None
    return "reduce-overhead" if value in ("1", "true", "on", "yes") else value


@dataclass(frozen=True)
class EngineConfig:
    """How the engine batches, caches and reads answers. Every field is reloadable: a reload starts
    fresh workers, and so fresh engines."""
    max_batch_size: int = reloadable(
        1, "Requests one forward pass may hold; 1 scores each alone.", group="batching", rule=integer(1))
    max_packed_tokens: int = reloadable(
        8192, "Padded tokens one forward pass may allocate; a bigger request is rejected.", group="batching",
        rule=integer(1))
    max_state_tokens: int = reloadable(
        8192, "Tokens the state may take; a longer one gets context_length_exceeded, on every readout.",
        group="batching", shown_default="8192, capped by the context window", rule=integer(1))
    max_branch_tokens: int = reloadable(
        8192, "State plus one question.", group="batching", shown_default="8192, capped by the context window",
        rule=integer(1))
    # A request joins a batch only while the batch stays under this; the oldest request always goes, so
    # nothing starves. 1.0 disables the check. None: the device's default (default_padding_waste).
    max_padding_waste: float | None = reloadable(
        None, "Fraction of a batch's padded tokens that may be padding before similar-length requests are "
        "kept apart.", group="batching", shown_default="0.1 on CPU, which computes every padded token; 0.5 on "
        "GPU", rule=fraction("must be between 0 and 1"))
    layout: str = reloadable(
        "auto", "auto | rows | packed | shared.", group="batching", rule=one_of(LAYOUTS))
    # adaptive: engine/batch_policy.py measures batched passes against single ones per width class.
    batch_policy: str = reloadable(
        "adaptive", "adaptive: batch a length class only where batched passes measured faster; greedy: "
        "always.", group="batching", rule=one_of(BATCH_POLICIES))
    # adaptive: engine/thread_policy.py measures passes on one thread against all of them per size class.
    thread_policy: str = reloadable(
        "adaptive", "adaptive: on a CPU, run a size class of passes on one thread where those measured faster "
        "than on all of a worker's threads (whose wake-ups are the host's to pay); fixed: always on all.",
        group="batching", rule=one_of(THREAD_POLICIES),
        more="See [One thread or all](MEASURING.md#one-thread-or-all).")
    # The prefix cache (JevAny's names and default); its byte bound keeps a cache on a GPU from starving
    # the batches. 0 turns it off, the prompt's kept head included.
    prefix_cache: int = reloadable(
        4, "States each worker keeps computed (--prefix-cache-size is JevAny's name), least recently used out "
        "first. A request computes only what the longest kept prefix of its prompt lacks (the prompt's head is "
        "always kept); size it to the states in use at once, e.g. an agent's sessions. 0: off.",
        group="batching", jevany_flags=("--prefix-cache-size",), rule=integer(0),
        more="See [The decision model](#the-decision-model).")
    prefix_min_tokens: int = reloadable(
        384, "Shortest state worth an entry, in tokens (the prompt's head and the state); shorter ones are "
        "computed each time, after the kept head.", group="batching", rule=integer(0))
    prefix_cache_bytes: int = reloadable(
        1 << 30, "Bytes the prefix cache may hold per worker (on the model's device), so it cannot starve the "
        "batches.", group="batching", rule=integer(1))

    # model/invariant.py: every product in fixed pieces, attention in fixed key blocks, widths rounded.
    batch_invariant: bool = reloadable(
        False, "Every answer the same to the last bit whatever it is batched with, wherever it sits in its "
        "pass, and alone: each request padded alone to a rounded width (layout auto: flat, or rows on hybrid "
        "models), without the prefix cache, in kernels whose order of operations no other row changes. For "
        "reproducing metrics while batching.", group="batching",
        more="See [Batch-invariant answers](#batch-invariant-answers).")

    # JevAny's serve options, same names and defaults.
    date_facts: bool = reloadable(
        False, "Add to each state one sentence per pair of absolute dates in it ('August 3, 2026 is 12 days "
        "after July 22, 2026.'), as JevAny's JEVANY_DATE_FACTS=1.", group="choice")
    choice_temperature: float | None = reloadable(
        None, "The choice readout's temperature.", group="choice",
        shown_default="the model's, 1.0 for a plain causal LM", legacy_flag="--letter-temperature",
        rule=number())
    # A log-linear blend with the checkpoint's native readout (0: none).
    choice_native_weight: float = reloadable(
        0.0, "0 to 1: blend the choice readout with the checkpoint's native readout in log space (JevAny's "
        "native_weight; a JevAny run directory's head).", group="choice", shown_default="0, choice alone",
        legacy_flag="--letter-pointer-weight", rule=fraction())
    choice_max_tokens: int = reloadable(
        16_384, "Longest choice prompt, the one-token answer included; capped by the context window.",
        group="choice", legacy_flag="--letter-max-tokens", rule=integer(2))

    # The shape plan (engine/shape_plan.py, replay.py): passes padded to a fixed set of shapes, every one
    # run before the worker is ready. shape_plan alone runs them eagerly; compile through torch.compile;
    # cuda_graphs as CUDA graphs captured at start. Either turns the plan on; they do not combine.
    shape_plan: bool = reloadable(
        False, "Pad every pass to one of a fixed set of shapes (rows x width, from --max-batch-size and "
        "--max-packed-tokens) and run each shape before the worker is ready, so no served pass meets a shape "
        "first (GPU kernels tune per shape). Implied by --compile and --cuda-graphs.", group="plan",
        more="See [GPUs: every pass a replay](GPUS.md#every-pass-a-replay-the-shape-plan).")
    compile: str | None = reloadable(
        None, "torch.compile every shape of the plan at start: default, reduce-overhead, max-autotune or "
        "max-autotune-no-cudagraphs; 1 is reduce-overhead, 0 off (JevAny's JEVANY_COMPILE). Minutes a shape "
        "on a CPU. Not with --cuda-graphs.", group="plan", shown_default="off", metavar="MODE",
        normalise=compile_mode, rule=one_of(COMPILE_MODES, f"must be 0, 1 or one of {', '.join(COMPILE_MODES)}"))
    cuda_graphs: bool = reloadable(
        False, "Capture every shape of the plan as a CUDA graph at start and replay it per pass (JevAny's, for "
        "batched passes here); CUDA only, one GPU per worker. Not yet measured on a GPU: see docs/GPUS.md.",
        group="plan")
    cuda_graph_max_tokens: int | None = reloadable(
        None, "Padded tokens of the largest pass captured (rows x width); bigger shapes of the plan run "
        "eagerly.", group="plan", shown_default="--max-packed-tokens", rule=integer(1))
    warmup_limit: float = reloadable(
        600.0, "Seconds warming the shape plan may take; a plan that would take longer stops the start (exit "
        "2) saying what to lower.", group="plan", rule=number("seconds"))

    @property
    def runner(self) -> str | None:
        """How planned passes run (replay.RUNNERS), or None: no plan, every pass as it comes."""
        if self.compile is not None:
            return "compiled"
        if self.cuda_graphs:
            return "graphs"
        return "eager" if self.shape_plan else None

    def __post_init__(self):
        check(self)
        if self.compile is not None and self.cuda_graphs:
            raise ValueError("compile cannot be combined with cuda_graphs (as in JevAny): each captures the "
                             "passes its own way; give one of them")
        if self.batch_invariant and self.layout not in ("auto", "rows"):
            raise ValueError(f"batch_invariant runs its own layouts (auto: flat, or rows on hybrid models), not "
                             f"{self.layout}: a packed or shared pass computes a request's tokens in an order that "
                             "depends on its neighbours")
        if self.batch_invariant and self.runner is not None:
            raise ValueError("batch_invariant cannot be combined with the shape plan (shape_plan, compile, "
                             "cuda_graphs): its buckets' fixed readout and compiled kernels are not proven "
                             "invariant")


# JevAny's JEVANY_ATTN picks an attention backend; the layouts' masks (block-causal,
# restarting positions, kept prefixes) are built and tested for sdpa alone.
ATTN_IMPLEMENTATIONS = ("sdpa",)


@dataclass(frozen=True)
class LoadOptions:
    """How a JevAny checkpoint becomes a model: JevAny's load options (its checkpoint.py LoadOptions), under
    its names and defaults. from_env reads its variables."""
    lora_scale: float = reloadable(
        1.0, "A JevAny checkpoint's LoRA update times this: 0 serves the base model, 1 the trained one "
        "(JevAny's JEVANY_LORA_SCALE).", group="load", rule=finite())
    merge: bool = reloadable(
        True, "Fold the LoRA into the base weights (in fp32, then cast); --no-merge runs it beside them, as "
        "JevAny's JEVANY_MERGE=0.", group="load", shown_default="merge")
    # Unless this allows the faster, slightly approximate merge, a checkpoint trained on a BF16 backbone
    # serves in BF16 with its adapter kept apart.
    merge_bf16: bool = reloadable(
        False, "Merge the LoRA of a checkpoint trained on a bf16 backbone too (faster, slightly approximate; "
        "JevAny's JEVANY_MERGE_BF16=1, which its docs recommend for serving).", group="load",
        shown_default="off, kept apart", more="Below FP32, JevAny keeps lm_token and trainable-token adapters "
        "apart as well, and so do we.")
    attn: str | None = reloadable(
        None, "Attention backend (JevAny's JEVANY_ATTN): sdpa, the one the daemon's layouts run on.",
        group="load", shown_default="sdpa",
        rule=one_of(ATTN_IMPLEMENTATIONS, "must be sdpa", why="the daemon's layouts are built and tested on "
                    "sdpa attention alone; unset it or set sdpa"))
    base_load_path: str | None = reloadable(
        None, "A local copy of a checkpoint's base model, read in place of head.pt's base (JevAny's "
        "JEVANY_BASE_LOAD_PATH); it must be a directory.", group="load", shown_default="head.pt's base",
        rule=Rule(lambda v: isinstance(v, str) and v != "", "must be a directory"))

    def __post_init__(self):
        check(self)

    @classmethod
    def from_env(cls, env=os.environ) -> "LoadOptions":
        """JevAny's variables: JEVANY_LORA_SCALE, _MERGE, _MERGE_BF16, _ATTN and _BASE_LOAD_PATH."""
        return cls(**read_environment(declared(cls), env))
