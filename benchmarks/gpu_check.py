"""The GPU check: is the GPU path correct, and does batching pay on it? One command, one JSON.

    scripts/gpu-check                        # on a CUDA host: 0.8B-shaped models, sized for 8 min on one H200
    scripts/gpu-check --cpu --shape tiny     # what CI runs (under 2 min on 2 cores): the same code, small

Models: random weights of Qwen3.5-0.8B's layer shape (--shape 0.8b) or the
tiny test shape, built on the spot into a temporary directory; nothing is
downloaded. qwen3_5 (hybrid, Gated DeltaNet) carries the rows and shared
layouts; packed is proven only for attention-only qwen3, so a qwen3 of the
same shape carries the packed cases.

First, whatever the phases: the SDPA kernel that serves per mask kind and dtype at the
models' attention heads and head size (the engine leaves cuDNN's out on CUDA; torch's own pick
is listed beside it), and what it returns for a query row with no allowed key (sdpa_probe.py).

Phases, in order (--phases runs some of them, --dtypes them in one dtype):
  parity      every readout (choice, pointer, lm_token) x every proven layout with the prefix
              cache off, plus the cached path (cache on) as a case of its own, x fp32 and bf16,
              in-process: the same requests batched (max_batch_size --batch) vs one at a time;
              max and mean |dp|, decisions changed, and every probability of both runs checked
              finite (math.isfinite), plus CUDA peak memory per case and the path that served
              it (gpu_parity.py)
  busy        per dtype, in-process on the default model: passes of --batch requests and passes
              of one, each timed, then run again under torch's profiler to read the device's
              timeline: device busy ms a pass (the union of its kernels and copies) against the
              wall ms, kernels and copies a pass, and Triton's autotuning benchmarks a pass; all
              of it three times: as served, with cuDNN's attention kernel let back in, and with
              the delta rule on PyTorch rather than fla's kernels (gpu_busy.py; on the CPU the
              wall ms alone); --busy-tune-rows N meets row counts 1-N first, so fla's tuning
              per new row count is not timed
  speed       per dtype, two real daemons (max_batch_size --batch and 1) on the default readout
              (choice, qwen3_5, default layout and batch policy), --clients client processes
              (jevany-client only) sending --requests requests closed-loop; rounds alternate
              which daemon goes first and the batched/serial ratio is the median of the
              per-round ratios, because a shared machine's speed drifts; and the batched
              daemon's throughput over the in-process ideal (pre-formed batches of --batch)
  idle        concurrency 1, blocks interleaved: in-process vs each daemon, p50
  memory      peak CUDA memory in this process (max_memory_allocated); the daemon workers'
              device memory in use, in total and their own peak, from status (device_info)
  graphs      per dtype, the shape plan's passes replayed as CUDA graphs (--cuda-graphs) against
              passes as they come: warm-up seconds and memory, parity, passes of --batch and of
              one (wall, device busy, kernels, autotuning while serving), in-process throughput
              for hand-overs of 32, 64 and 128, the delta rule on PyTorch under graphs (bf16),
              and in bf16 a batched and a serial graphs daemon, --clients closed-loop, every
              round kept (gpu_graphs.py; on the CPU the plan runs eagerly, nothing judged)
  invariant   per dtype, in-process: --parity-n requests alone, then in random passes of up to
              --batch, with today's kernels and with --batch-invariant: answers bit-identical to
              their answers alone, and throughput of each (gpu_invariant.py; reported, not judged)

Targets, judged at the end: fp32 parity max |dp| <= 1e-5, 0 decisions changed, every
probability finite (fp32 and bf16), no request failed; the daemons counted no pass with a
non-finite probability (where status reports it); on a GPU also batched/serial >= 3x in
fp32 and >= 6x in bf16 (speed targets are GPU targets: "not judged on cpu"); graphs: fp32
parity with passes as they come <= 1e-5, no non-finite probability, and on a GPU no
autotuning in served passes, a bf16 pass of one <= 8 ms, the bf16 batched graphs daemon
>= 1000 req/s in every round.

Defaults: on a GPU 32 clients, 192 requests, 3 rounds, 32 parity requests, 32 idle requests,
6 busy passes (on an H200, 2026-12-04, the parity phase's 30 cases took 328 s at 64 requests
a case); with --cpu 8 clients (32 clients would only measure 2 cores' scheduling), 32
requests, 2 rounds, 16 parity requests, 16 idle requests, 2 busy passes, and one torch
thread in-process and in each daemon worker (--cpu-threads 1). The JSON records the sizes used.

Writes benchmarks/results/gpu-check-<device>-<shape>.json (--out to change), also when
the run fails part-way (with "error"). Exit status: 0 every judged target met; 1 a judged
target not met; 2 bad usage, or CUDA requested but unavailable; 3 the check could not
finish (a daemon failed to start, the --time-limit passed, a crash): see the message.
"""
import argparse
import gc
import importlib.util
import itertools
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")           # nothing here may reach the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import torch

    import sdpa_probe
    from bench import MEASURED_SEED, WARM_SEED, InProcess, idle_latency, real_tokens, summary
    from gpu_busy import busy_phase, tune_rows
    from gpu_daemons import CPU_THREADS, CheckDaemon, CheckError, Fleet, close_pool, daemon_name
    from gpu_graphs import daemon_args, daemon_rounds, graphs_phase
    from gpu_invariant import invariant_phase
    from gpu_parity import DTYPES, LAYOUTS, READOUTS, parity_phase
    from gpu_report import judge, print_speed, print_targets
    from harness import ClientPool, machine, median, percentile, write_result
    from jevany_daemon import workloads
    from jevany_daemon.model.kernels import strict_fp32
    from jevany_daemon.model.loading import load_model
    from jevany_daemon.model.tiny import SHAPES, build_tiny_model
except ImportError as exc:     # a bare GPU host: say what is missing, not a traceback
    print(f"gpu-check: error: {exc}; it needs the project's requirements (torch, transformers, peft, pyzmq, "
          "msgpack, typer): `make install`, or carry them", file=sys.stderr)
    sys.exit(2)

HERE = Path(__file__).resolve().parent

EXIT_MET, EXIT_NOT_MET, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3

SPEED_MODEL = ("qwen3_5", "choice")     # what users run: the hybrid model, the default readout
PHASES = ("parity", "busy", "speed", "graphs", "invariant")
BUDGET_S = 480                          # the 8 minutes a GPU run must fit

SIZES = {   # (GPU, --cpu): see the module docstring
    "clients": (32, 8), "requests": (192, 32), "rounds": (3, 2), "parity_n": (32, 16), "idle_requests": (32, 16),
    "busy_passes": (6, 2), "graphs_max_tokens": (8192, 512),
}


class Aborted(BaseException):
    """The time limit passed or a signal came. A BaseException, like KeyboardInterrupt: raised
    inside a forward pass, an Exception would be caught by the engine, which rescores the
    batch's requests one by one, and the run would go on."""


# --- the machine ------------------------------------------------------------

def machine_info(device: str) -> dict:
    import transformers

    info = {"device": device, "device_name": "cpu", "torch": torch.__version__,
            "transformers": transformers.__version__, **machine(), "cuda": torch.version.cuda,
            # the fast Gated DeltaNet kernels; without them transformers runs a slower torch fallback
            "kernels": {name: importlib.util.find_spec(name) is not None for name in ("fla", "causal_conv1d")}}
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
        # TF32 would loosen FP32 parity: off in matmuls and cuDNN, as the daemon's workers have it
        strict_fp32(torch.device("cuda"))
        info["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        info["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
    return info


def device_kind(info: dict) -> str:
    return "cpu" if info["device"] == "cpu" else "-".join(info["device_name"].lower().split())


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: str) -> int | None:
    return torch.cuda.max_memory_allocated() if device == "cuda" else None


def release(device: str) -> None:
    """Free a model before the next loads, so peaks and memory stay per model."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# --- models -------------------------------------------------------------------

def model_keys(phases=PHASES) -> list[tuple[str, str]]:
    """The models the phases load: parity every (arch, readout); speed and busy the default one."""
    parity = set(itertools.product(LAYOUTS, READOUTS)) if "parity" in phases else set()
    return sorted(parity | ({SPEED_MODEL} if set(phases) - {"parity"} else set()))


def probe_shape(shape: str) -> tuple[int, int, int, int]:
    """sdpa_probe's (batch, heads, positions, head_dim) at this shape's attention heads."""
    return 2, SHAPES[shape]["num_attention_heads"], 16, SHAPES[shape]["head_dim"]


def build_workers(shape: str, phases=PHASES) -> int:
    """A 0.8B-shaped build takes 10-20 s of CPU and disk, so where there are cores to spare (a GPU
    host has them) they build side by side; a tiny one takes less than a process takes to start."""
    return 1 if shape == "tiny" else max(1, min(len(model_keys(phases)), (os.cpu_count() or 1) // 4))


def build_models(shape: str, root: Path, workers: int, phases) -> dict:
    """Every (arch, readout) model the phases load, once."""
    jobs = {key: (root / f"{key[0]}-{key[1]}", key[0], key[1], 0, shape) for key in model_keys(phases)}
    if workers <= 1:
        return {key: build_tiny_model(*job) for key, job in jobs.items()}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {key: pool.submit(build_tiny_model, *job) for key, job in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


# --- speed, idle and memory through the daemons -------------------------------

def speed_rounds(daemons: dict, pool: ClientPool, bodies: list, clients: int, rounds: int) -> dict:
    """Both daemons on the same requests in every round, alternating who goes first, so the
    machine's drift within the run falls on both alike."""
    out = {name: [] for name in daemons}
    order = list(daemons)
    for k in range(rounds):
        for name in order[k % 2:] + order[:k % 2]:
            out[name].append(pool.run(daemons[name], bodies, clients))
    return out


def dtype_phase(dtype: str, daemons: dict, pool: ClientPool | None, model_dir: Path, device: str, args,
                out: dict, save) -> None:
    """One dtype, one load of the model: the busy phase in-process first (the daemons are idle
    then), then the speed phase through the daemons, then the graphs phase. Fills `out` as it
    goes, and save() writes the whole result after each part."""
    release(device)
    reset_peak(device)
    model = load_model(str(model_dir), device=device, dtype=dtype)
    ref = InProcess(model, args.batch)
    if "busy" in args.phases:
        if args.busy_tune_rows:
            tuned = out["busy_rows_tuned"] = tune_rows(model, args.busy_tune_rows, device)
            if tuned is not None:
                print(f"  {dtype} busy: row counts 1-{tuned['rows']} met in the delta rule first, "
                      f"{tuned['seconds']:.1f} s, {tuned['autotune_benchmarks']} autotuning benchmarks")
        busy_phase(ref, model, workloads.WORKLOADS[args.workload], args.batch, device, out.setdefault("busy", {}),
                   dtype, args.busy_passes)
    if "speed" in args.phases:
        out.update(speed_phase(dtype, daemons, pool, model, ref, device, args))
        save()
    del ref              # its engines' memory, before the graphs phase builds its own
    release(device)
    if "graphs" in args.phases:
        graphs = out.setdefault("graphs", {})
        graphs_phase(model, device, args, graphs, save, dtype)
        served = {name: daemons[name] for name in (daemon_name(dtype, args.batch, "graphs"),
                                                   daemon_name(dtype, 1, "graphs")) if name in daemons}
        if len(served) == 2:
            graphs["daemons"] = daemon_rounds(served, pool, measured_requests(args), args.clients, args.rounds)
            print(f"  {dtype} graphs daemons: {graphs['daemons']['rps_rounds']}, batched / serial "
                  f"{graphs['daemons']['batched_over_serial']:.2f}x")
            save()
    del model
    release(device)
    if "invariant" in args.phases:
        invariant_phase(model_dir, device, dtype, args, out.setdefault("invariant", {}))
        save()
        release(device)


def speed_phase(dtype: str, daemons: dict, pool: ClientPool, model, ref: InProcess, device: str, args) -> dict:
    """Warm up, idle latencies, throughput rounds, then the in-process ideal and memory."""
    bodies = measured_requests(args)
    serial, batched = daemons[daemon_name(dtype, 1)], daemons[daemon_name(dtype, args.batch)]
    # Warmed on requests of their own: on a GPU, a shape met before is cheaper (cuDNN's plans,
    # Triton's tunings, cuBLAS's choices), and the serial daemon, warmed on the idle requests one
    # at a time, would meet them at idle in exactly their shapes while the others had not.
    warm = warm_up_requests(args)
    for d in (serial, batched):     # CUDA kernels, the allocator, the adaptive policy's first measurements
        pool.run(d, warm, args.clients)
    ref.serial_rps(warm[:2])
    ref.ideal_rps(warm)
    idle = idle_report(ref, {1: serial, args.batch: batched}, bodies[: args.idle_requests])
    runs = speed_rounds({1: serial, args.batch: batched}, pool, bodies, args.clients, args.rounds)
    tokens = real_tokens(model, bodies)
    ratios = [b["rps"] / s["rps"] for b, s in zip(runs[args.batch], runs[1])]
    speed = {"workload": args.workload, "requests": len(bodies), "clients": args.clients,
             "tokens_per_request": tokens, "layout": ref.serial.layout.name,
             "serial": summary(1, args.clients, runs[1], tokens),
             "batched": summary(args.batch, args.clients, runs[args.batch], tokens),
             "batched_over_serial": median(ratios), "batched_over_serial_rounds": ratios,
             "inprocess_ideal_rps": ref.ideal_rps(bodies),
             "daemon_non_finite": non_finite_served(serial, batched)}
    # The host path's cost on a real device: the batched daemon's throughput against the engine's own
    # in ideal pre-formed batches, what the host path between the two costs
    speed["daemon_over_ideal"] = speed["batched"]["rps"] / speed["inprocess_ideal_rps"]
    memory = {"inprocess_peak_bytes": peak_bytes(device), "workers": worker_memory(serial, batched, device)}
    print_speed(dtype, speed, idle, memory)
    return {"speed": speed, "idle": idle, "memory": memory}


def measured_requests(args) -> list[dict]:
    """The speed phase's requests: the throughput rounds send them all, the idle run the first --idle-requests."""
    return workloads.WORKLOADS[args.workload](args.requests, seed=MEASURED_SEED)


def warm_up_requests(args) -> list[dict]:
    """The speed phase's warm-up: two requests a client, none of them among the measured ones."""
    return workloads.WORKLOADS[args.workload](2 * args.clients, seed=WARM_SEED)


def non_finite_served(*daemons: CheckDaemon) -> int | None:
    """Passes the daemons found non-finite probabilities in (and rescored alone), where status
    reports it; None where it does not."""
    counts = [d.batching().get("non_finite") for d in daemons]
    return None if None in counts else sum(counts)


def idle_report(ref: InProcess, daemons: dict, bodies: list) -> dict:
    lat = idle_latency(ref, daemons, bodies)
    p50 = {name: percentile(values, 0.5) * 1000 for name, values in lat.items()}
    serial, batched = sorted(daemons)
    return {"requests": len(bodies), "inprocess_p50_ms": p50["inprocess"], "daemon_p50_ms": p50[serial],
            "batched_daemon_p50_ms": p50[batched],
            "daemon_over_inprocess": p50[serial] / p50["inprocess"],
            "batched_daemon_over_inprocess": p50[batched] / p50["inprocess"],
            # the daemon's own cost: the same request through the daemon minus in-process, median
            "overhead_ms": statistics.median(d - i for d, i in zip(lat[serial], lat["inprocess"])) * 1000}


def worker_memory(serial: CheckDaemon, batched: CheckDaemon, device: str) -> dict:
    """Each daemon's workers as status reports them (device_info): the device's memory in use and in
    total, and the worker's own peak (on a GPU its allocator's most reserved; on the CPU its resident
    memory)."""
    return {label: [{"pid": w["pid"], **(w.get("device_info") or {})} for w in d.client.status()["workers"]]
            for label, d in (("serial", serial), ("batched", batched))}


# --- the run --------------------------------------------------------------------

@contextmanager
def phase(result: dict, name: str):
    print(f"\n== {name}", flush=True)
    started = time.monotonic()
    try:
        yield
    finally:
        result["phase_s"][name] = round(time.monotonic() - started, 1)


def run(args, device: str, result: dict) -> None:
    """Fills `result` phase by phase, so a failure part-way still leaves what was measured."""
    root = Path(tempfile.mkdtemp(prefix="jv-gpu-check-"))
    fleet, pool = Fleet(), None
    try:
        with phase(result, "build models"):
            dirs = build_models(args.shape, root, build_workers(args.shape, args.phases), args.phases)
        if "speed" in args.phases:
            for dtype in args.dtypes:
                for batch in (1, args.batch):
                    fleet.launch(daemon_name(dtype, batch), dirs[SPEED_MODEL], device, dtype, batch)
        if "graphs" in args.phases:         # bf16's (what throughput is served in), or the one dtype asked
            dtype = "bf16" if "bf16" in args.dtypes else args.dtypes[0]
            for batch in (1, args.batch):
                fleet.launch(daemon_name(dtype, batch, "graphs"), dirs[SPEED_MODEL], device, dtype, batch,
                             daemon_args(device, args.graphs_max_tokens))
        # the kernel that serves at the checked models' heads and head size: what parity and busy ran
        result["sdpa"] = sdpa_probe.probe(device, shape=probe_shape(args.shape))
        sdpa_probe.print_probe(result["sdpa"])
        if "parity" in args.phases:
            with phase(result, "parity"):
                result["parity"] = []
                parity_phase(dirs, device, args, result["parity"], (release, reset_peak, peak_bytes))
        daemons = {}
        if {"speed", "graphs"} & set(args.phases):
            with phase(result, "start daemons and clients"):
                daemons = fleet.wait()
                pool = ClientPool(args.clients)
        per_dtype = [p for p in PHASES if p in args.phases and p != "parity"]
        if per_dtype:
            result["dtypes"] = {}
            for dtype in args.dtypes:
                with phase(result, f"{' and '.join(per_dtype)}, {dtype}"):
                    dtype_phase(dtype, daemons, pool, dirs[SPEED_MODEL], device, args,
                                result["dtypes"].setdefault(dtype, {}), lambda: write_result(result, args.out))
    finally:
        signal.alarm(0)     # the clean-up itself must not be cut short
        fleet.stop()
        if pool is not None:
            close_pool(pool)
        shutil.rmtree(root, ignore_errors=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="gpu-check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="run on the CPU instead of cuda (speed targets not judged)")
    p.add_argument("--shape", default="0.8b", choices=("tiny", "0.8b"),
                   help="0.8b: Qwen3.5-0.8B's layer shape; tiny: the test models [default: 0.8b]")
    p.add_argument("--requests", type=int, help="requests per throughput round [default: 192, --cpu 32]")
    p.add_argument("--clients", type=int, help="concurrent client processes [default: 32, --cpu 8]")
    p.add_argument("--rounds", type=int, help="throughput rounds per dtype [default: 3, --cpu 2]")
    p.add_argument("--parity-n", type=int, help="requests per parity case [default: 32, --cpu 16]")
    p.add_argument("--idle-requests", type=int, help="requests at concurrency 1 [default: 32, --cpu 16]")
    p.add_argument("--busy-passes", type=int, help="measured passes of --batch requests in the busy phase, "
                   "after 2 unmeasured ones; 4 times as many passes of one [default: 6, --cpu 2]")
    p.add_argument("--busy-tune-rows", type=int, default=0, metavar="N",
                   help="before the busy phase, call the served delta rule once for every row count "
                        "from 1 to N, so fla's autotuning (once per new row count) is done before any "
                        "pass is timed; the busy phase lists the row counts its passes had "
                        "(delta_rule_rows) [default: 0, none]")
    p.add_argument("--batch", type=int, default=32, help="max_batch_size of the batched daemon and parity runs")
    p.add_argument("--graphs-max-tokens", type=int, help="the graphs phase's --max-packed-tokens: its plan's "
                   "largest pass, what its warm-up and memory grow with [default: 8192, --cpu 512]")
    p.add_argument("--workload", default="short", choices=list(workloads.WORKLOADS),
                   help="requests of the throughput and idle runs [default: short, 20-40 token states, "
                        "bench.py's headline workload]")
    p.add_argument("--time-limit", type=int, default=570, metavar="S",
                   help="give up after S seconds, stopping every daemon and writing what was measured "
                        "(exit 3); 0: no limit [default: 570, inside a 10-minute job]")
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES), metavar="PHASE",
                   help=f"run only these phases, of {', '.join(PHASES)} (a short time on a device can "
                        "finish what a cut run left) [default: all]")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES), metavar="DTYPE",
                   help=f"the dtypes every phase runs, of {', '.join(DTYPES)} [default: both]")
    p.add_argument("--out", type=Path, help="JSON path [default: benchmarks/results/gpu-check-<device>-<shape>.json]")
    args = p.parse_args(argv)
    for name, (gpu, cpu) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, cpu if args.cpu else gpu)
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def _abort(signum, frame):
    # Raised, not flagged: the main thread may sit in a blocking receive from a client or a
    # daemon, and only an exception gets it out through the finally blocks that stop them.
    raise Aborted("time limit passed" if signum == signal.SIGALRM else f"stopped by signal {signum}")


def new_result(args, device: str) -> dict:
    return {"check": "gpu-check", "machine": machine_info(device), "error": None, "phase_s": {},
            "settings": {"shape": args.shape, "phases": args.phases, "dtypes": args.dtypes,
                         "speed_model": "/".join(SPEED_MODEL), "layouts": LAYOUTS, "batch": args.batch,
                         "batch_policy": "adaptive", "workload": args.workload,
                         "torch_threads": CPU_THREADS if args.cpu else None,
                         "busy_tune_rows": args.busy_tune_rows, **{name: getattr(args, name) for name in SIZES}}}


def guarded_run(args, device: str, result: dict) -> None:
    """run() under the time limit and signals; any failure becomes result["error"]."""
    signal.signal(signal.SIGTERM, _abort)
    signal.signal(signal.SIGALRM, _abort)
    signal.alarm(args.time_limit)
    try:
        run(args, device, result)
    except Aborted as exc:
        result["error"] = f"{exc}" + (f" (--time-limit {args.time_limit})" if "time limit" in str(exc) else "")
    except (CheckError, KeyboardInterrupt) as exc:
        result["error"] = str(exc) or type(exc).__name__
    except Exception as exc:      # a bug or a broken dependency: still stop, report and write
        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    device = "cpu" if args.cpu else "cuda"
    if args.cpu:
        torch.set_num_threads(CPU_THREADS)
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: error: CUDA is not available to this process (torch "
              f"{torch.__version__}, CUDA build {torch.version.cuda}); run on a GPU host, or pass --cpu",
              file=sys.stderr)
        return EXIT_USAGE
    started = time.monotonic()
    result = new_result(args, device)
    out = args.out = args.out or HERE / "results" / f"gpu-check-{device_kind(result['machine'])}-{args.shape}.json"
    guarded_run(args, device, result)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result["targets"] = judge(result)
    result["passed"] = result["error"] is None and all(t["met"] for t in result["targets"] if t["judged"])
    print_targets(result["targets"])
    print(f"elapsed {result['elapsed_s']:.0f} s ({', '.join(f'{k} {v:.0f}' for k, v in result['phase_s'].items())})")
    if device == "cuda" and args.shape == "0.8b" and result["elapsed_s"] > BUDGET_S:
        print(f"note: over the {BUDGET_S} s budget; lower --requests, --rounds or --parity-n")
    write_result(result, out)
    if result["error"]:
        print(f"gpu-check: error: {result['error']}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_MET if result["passed"] else EXIT_NOT_MET


if __name__ == "__main__":
    sys.exit(main())
