"""The jevany-daemon command line."""
import logging
from enum import Enum
from pathlib import Path

import typer

app = typer.Typer(
    name="jevany-daemon",
    help="Serve decision models to fleets of client processes over ZeroMQ.",
    no_args_is_help=True,
    add_completion=False,
    # Plain help: the boxed layout squeezed descriptions to a few words a line at 80 columns.
    rich_markup_mode=None,
)


class Arch(str, Enum):
    qwen3 = "qwen3"
    qwen3_5 = "qwen3_5"


class TinyReadout(str, Enum):
    choice = "choice"
    pointer = "pointer"
    lm_token = "lm_token"


@app.callback()
def main() -> None:
    """Serve decision models to fleets of client processes over ZeroMQ."""


STARTER_DIR = Path("runs/starter")


@app.command("tiny-model")
def tiny_model(
    ctx: typer.Context,
    out: Path = typer.Argument(None, metavar="OUT", help="Directory to write the model to (created if missing). "
                               f"Required, except with --trained: {STARTER_DIR}.", show_default=False),
    arch: Arch = typer.Option(
        Arch.qwen3, "--arch", help="qwen3: attention only. qwen3_5: hybrid Gated DeltaNet + attention."
    ),
    readout: TinyReadout = typer.Option(
        TinyReadout.choice,
        "--readout",
        help="choice: a plain Hugging Face model directory. pointer / lm_token: a JevAny run "
        "directory (LoRA adapter, head.pt) with its base model in OUT/base.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for the random weights; same seed, same model."),
    multimodal: bool = typer.Option(
        False, "--multimodal", help="qwen3_5 only: the conditional-generation model with a tiny vision tower "
        "and its processor (images and videos). [default: off]", show_default=False,
    ),
    trained: bool = typer.Option(
        False, "--trained", help="Train the starter model instead (about a minute on 2 CPU cores): a qwen3 "
        "pointer checkpoint that routes, rates and prioritises support tickets, with its held-out suite in "
        "OUT/heldout.jsonl and its held-out accuracy and ECE printed and kept in OUT/training.json. "
        "[default: off]", show_default=False,
    ),
) -> None:
    """Build a tiny random model of a real architecture, with a tokenizer trained on the spot.

    For tests and smoke deployments: nothing is downloaded, and the result
    loads through the same path as a real model or JevAny checkpoint. With
    --trained the weights are trained, not random (see --trained).
    """
    if trained:
        _trained_model(ctx, out or STARTER_DIR, seed)
        return
    from jevany_daemon.model.tiny import build_tiny_model

    if out is None:
        typer.echo("error: missing argument OUT (only --trained has a default)", err=True)
        raise typer.Exit(2)
    if multimodal and arch != Arch.qwen3_5:
        typer.echo(f"error: --multimodal needs --arch qwen3_5, not {arch.value}", err=True)
        raise typer.Exit(2)
    try:
        path = build_tiny_model(out, arch=arch.value, readout=readout.value, seed=seed, multimodal=multimodal)
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    kind = " multimodal" if multimodal else ""
    typer.echo(f"wrote {arch.value}{kind} {readout.value} model to {path}")


def _trained_model(ctx: typer.Context, out: Path, seed: int) -> None:
    from jevany_daemon.starter.build import build_trained_model
    from jevany_daemon.starter.evaluate import format_report
    from jevany_daemon.starter.train import Recipe

    # .name: the enum is click's, or typer's own copy of click's, depending on the typer version.
    fixed = [f"--{name.replace('_', '-')}" for name in ("arch", "readout", "multimodal")
             if ctx.get_parameter_source(name).name == "COMMANDLINE"]
    if fixed:
        typer.echo(f"error: --trained builds a qwen3 pointer checkpoint; {', '.join(fixed)} does not apply", err=True)
        raise typer.Exit(2)
    typer.echo(f"training the starter model into {out} ...")
    try:
        figures = build_trained_model(out, Recipe(seed=seed))
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"trained in {figures['train_seconds']:.0f} s; held-out split ({out / 'heldout.jsonl'}), "
               "scored through the engine:")
    typer.echo(format_report(figures["heldout"]))
    typer.echo(f"wrote qwen3 pointer checkpoint to {out}")


@app.command("serve")
def serve(
    model: str = typer.Option(None, "--model", "--checkpoint", "--run", help="Local model directory, JevAny run "
                              "directory or hub id (--checkpoint and --run are JevAny's names). [default: a "
                              "built-in tiny demo model with random weights]", show_default=False),
    readout: str = typer.Option(None, "--readout", help="choice | pointer | lm_token, or JevAny's native (the "
                                "checkpoint's own) and letter (choice). [default: the checkpoint's own readout, or "
                                "choice for a plain causal LM]", show_default=False),
    model_id: str = typer.Option(None, "--model-id", "--model-name", help="Name replies give as 'model' "
                                 "(--model-name is JevAny's name). [default: from the source]", show_default=False),
    temperature: float = typer.Option(None, "--temperature", help="The native readouts' (pointer, lm_token) "
                                      "temperature, as JevAny's JEVANY_TEMPERATURE; not with the choice readout "
                                      "(--choice-temperature). [default: the checkpoint's, from head.pt]",
                                      show_default=False),
    device: str = typer.Option(None, "--device", help="auto, cpu, cuda (= cuda:0) or cuda:N; a comma-separated "
                               "list (cuda:0,cuda:1) starts one worker per device. Each worker sees only its own "
                               "GPU(s). auto: the first CUDA device where one is visible, else cpu, as JevAny "
                               "picks (the log says which). [default: auto]", show_default=False),
    device_map: str = typer.Option(None, "--device-map", help="auto | balanced | balanced_low_0 | sequential: "
                                   "one worker spreads the model over every GPU in --device (cuda: all of "
                                   "them), for a checkpoint too big for one GPU; placement by Accelerate. "
                                   "--workers must then be 1 (its default). [default: off, one whole model "
                                   "per GPU]",
                                   show_default=False),
    max_memory_gib: float = typer.Option(None, "--max-memory-gib", help="With --device-map: GiB of weights "
                                         "each GPU may take; lower it to leave room for activations. A model "
                                         "that does not fit fails to load (never offloaded to CPU or disk). "
                                         "[default: each GPU's free memory]", show_default=False),
    workers: int = typer.Option(None, "--workers", help="Worker processes, each with its own copy of the model, "
                                "fed from one queue; spread evenly over --device. [default: one per device]",
                                show_default=False),
    cpu_threads: int = typer.Option(None, "--cpu-threads", help="Torch threads of each CPU worker. Lower it "
                                    "when clients or other work share the host: a forward pass split over "
                                    "threads waits for the slowest. [default: the cores divided among the CPU "
                                    "workers]", show_default=False),
    heartbeat_timeout: float = typer.Option(None, "--heartbeat-timeout", help="Seconds a ready worker may go "
                                            "without a heartbeat before it is killed and replaced. [default: 10]",
                                            show_default=False),
    batch_timeout: float = typer.Option(None, "--batch-timeout", help="Seconds one batch may take before its "
                                        "worker counts as hung, is killed and replaced; its requests get "
                                        "worker_lost. [default: 120]", show_default=False),
    dtype: str = typer.Option(None, "--dtype", help="fp32, bf16 or fp16. [default: the checkpoint's: bf16 for one "
                              "trained on a bf16 backbone (head.pt weights_dtype), else fp32]", show_default=False),
    lora_scale: float = typer.Option(None, "--lora-scale", help="A JevAny checkpoint's LoRA update times this: 0 "
                                     "serves the base model, 1 the trained one (JevAny's JEVANY_LORA_SCALE). "
                                     "[default: 1]", show_default=False),
    merge: bool = typer.Option(None, "--merge/--no-merge", help="Fold the LoRA into the base weights (in fp32, "
                               "then cast); --no-merge runs it beside them, as JevAny's JEVANY_MERGE=0. "
                               "[default: merge]", show_default=False),
    merge_bf16: bool = typer.Option(None, "--merge-bf16/--no-merge-bf16", help="Merge the LoRA of a checkpoint "
                                    "trained on a bf16 backbone too (faster, slightly approximate; JevAny's "
                                    "JEVANY_MERGE_BF16=1, which its docs recommend for serving). [default: off, "
                                    "kept apart]", show_default=False),
    attn: str = typer.Option(None, "--attn", help="Attention backend (JevAny's JEVANY_ATTN): sdpa, the one the "
                             "daemon's layouts run on. [default: sdpa]", show_default=False),
    base_load_path: str = typer.Option(None, "--base-load-path", help="A local copy of a checkpoint's base model, "
                                       "read in place of head.pt's base (JevAny's JEVANY_BASE_LOAD_PATH). "
                                       "[default: head.pt's base]", show_default=False),
    shape_plan: bool = typer.Option(None, "--shape-plan/--no-shape-plan", help="Pad every pass to one of a "
                                    "fixed set of shapes (rows x width, from --max-batch-size and "
                                    "--max-packed-tokens) and run each shape before the worker is ready, so no "
                                    "served pass meets a shape first (GPU kernels tune per shape). Implied by "
                                    "--compile and --cuda-graphs. [default: off]", show_default=False),
    compile: str = typer.Option(None, "--compile", metavar="MODE", help="torch.compile every shape of the plan "
                                "at start: default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs; "
                                "1 is reduce-overhead, 0 off (JevAny's JEVANY_COMPILE). Minutes a shape on a "
                                "CPU. Not with --cuda-graphs. [default: off]", show_default=False),
    cuda_graphs: bool = typer.Option(None, "--cuda-graphs/--no-cuda-graphs", help="Capture every shape of the "
                                     "plan as a CUDA graph at start and replay it per pass (JevAny's, for "
                                     "batched passes here); CUDA only, one GPU per worker. Not yet measured on a "
                                     "GPU: see docs/GPUS.md. [default: off]", show_default=False),
    cuda_graph_max_tokens: int = typer.Option(None, "--cuda-graph-max-tokens", help="Padded tokens of the "
                                              "largest pass captured (rows x width); bigger shapes of the plan "
                                              "run eagerly. [default: --max-packed-tokens]", show_default=False),
    warmup_limit: float = typer.Option(None, "--warmup-limit", help="Seconds warming the shape plan may take; a "
                                       "plan that would take longer stops the start (exit 2) saying what to "
                                       "lower. [default: 600]", show_default=False),
    bind: list[str] = typer.Option(None, "--bind", help="Public endpoint, ipc://PATH or tcp://HOST:PORT; repeat "
                                   "for several. [default: ipc://$XDG_RUNTIME_DIR/jevany/daemon.sock]",
                                   show_default=False),
    socket_mode: str = typer.Option(None, "--socket-mode", help="File mode for public ipc sockets, e.g. 0660 "
                                    "so the daemon's group may connect. The control socket stays 0600. "
                                    "[default: leave the umask's]", show_default=False),
    control: str = typer.Option(None, "--control", help="Control endpoint for clear_cache, drain, reload; '' "
                                "disables it. [default: ipc://$XDG_RUNTIME_DIR/jevany/control.sock]",
                                show_default=False),
    max_batch_size: int = typer.Option(None, "--max-batch-size", help="Requests one forward pass may hold; 1 "
                                       "scores each alone. [default: 1]", show_default=False),
    max_packed_tokens: int = typer.Option(None, "--max-packed-tokens", help="Padded tokens one forward pass may "
                                          "allocate; a bigger request is rejected. [default: 8192]",
                                          show_default=False),
    max_state_tokens: int = typer.Option(None, "--max-state-tokens", help="Tokens the state may take; a longer "
                                         "one gets context_length_exceeded, on every readout. [default: 8192, "
                                         "capped by the context window]", show_default=False),
    max_branch_tokens: int = typer.Option(None, "--max-branch-tokens", help="State plus one question. [default: "
                                          "8192, capped by the context window]", show_default=False),
    max_padding_waste: float = typer.Option(None, "--max-padding-waste", help="Fraction of a batch's padded tokens "
                                            "that may be padding before similar-length requests are kept apart. "
                                            "[default: 0.1 on CPU, which computes every padded token; 0.5 on "
                                            "GPU]", show_default=False),
    layout: str = typer.Option(None, "--layout", help="auto | rows | packed | shared. [default: auto]",
                               show_default=False),
    batch_policy: str = typer.Option(None, "--batch-policy", help="adaptive: batch a length class only where "
                                     "batched passes measured faster; greedy: always. [default: adaptive]",
                                     show_default=False),
    prefix_cache: int = typer.Option(None, "--prefix-cache", "--prefix-cache-size", help="States each worker keeps "
                                     "computed (--prefix-cache-size is JevAny's name), least "
                                     "recently used out first. A request computes only what the longest kept "
                                     "prefix of its prompt lacks (the prompt's head is always kept); size it to "
                                     "the states in use at once, e.g. an agent's sessions. 0: off. "
                                     "[default: 4]", show_default=False),
    prefix_min_tokens: int = typer.Option(None, "--prefix-min-tokens", help="Shortest state worth an entry, in "
                                          "tokens (the prompt's head and the state); shorter ones are computed "
                                          "each time, after the kept head. [default: 384]", show_default=False),
    prefix_cache_bytes: int = typer.Option(None, "--prefix-cache-bytes", help="Bytes the prefix cache may hold "
                                           "per worker (on the model's device), so it cannot starve the "
                                           "batches. [default: 1073741824]", show_default=False),
    max_queue: int = typer.Option(None, "--max-queue", help="Requests that may wait; beyond it replies are "
                                  "'overloaded' at once. [default: 1024]", show_default=False),
    max_message_bytes: int = typer.Option(None, "--max-message-bytes", help="Bigger messages are refused by "
                                          "ZeroMQ before the daemon reads them. [default: 8388608]",
                                          show_default=False),
    log_requests: bool = typer.Option(None, "--log-requests/--no-log-requests", help="One log line per request. "
                                      "[default: off]", show_default=False),
    public_cache_counters: bool = typer.Option(None, "--public-cache-counters/--no-public-cache-counters",
                                               help="Show the prefix cache's hits and misses on the public "
                                               "endpoints and /v1/models, as JevAny does. Only where every "
                                               "client is one tenant: a hit tells one client what another "
                                               "sent. [default: off: on the control endpoint only]",
                                               show_default=False),
    metrics_port: int = typer.Option(None, "--metrics-port", help="Serve Prometheus metrics on "
                                     "http://METRICS_HOST:PORT/metrics; 0 picks a free port (see status). "
                                     "[default: off]", show_default=False),
    metrics_host: str = typer.Option(None, "--metrics-host", help="Address the metrics listen on; other than "
                                     "loopback it needs --insecure (they are unauthenticated). "
                                     "[default: 127.0.0.1]", show_default=False),
    curve_secret_key: str = typer.Option(None, "--curve-secret-key", help="Server key file (keygen's "
                                         "PREFIX.key_secret); TCP endpoints then require CurveZMQ. "
                                         "[default: none, plain TCP on loopback only]", show_default=False),
    curve_allowed_clients: str = typer.Option(None, "--curve-allowed-clients", help="Directory of client public "
                                              "key files (*.key); only those clients get replies. Re-read on "
                                              "reload. [default: none]", show_default=False),
    insecure: bool = typer.Option(None, "--insecure/--no-insecure", help="Allow plain TCP on a non-loopback "
                                  "address (anyone who reaches it can use the model). [default: off]",
                                  show_default=False),
    http: str = typer.Option(None, "--http", help="HOST:PORT to serve JevAny's HTTP routes on (POST "
                             "/v1/systemone, GET /v1/models, GET /health), from a gateway process sharing "
                             "the same queue and batches. A non-loopback address needs --http-token-file or "
                             "--insecure. [default: off]", show_default=False),
    http_token_file: str = typer.Option(None, "--http-token-file", help="File holding the token HTTP callers "
                                        "must send as 'Authorization: Bearer TOKEN'. [default: none]",
                                        show_default=False),
    http_cors_origins: str = typer.Option(None, "--http-cors-origins", help="Origins a browser page may call the "
                                          "HTTP routes from, comma-separated (https://app.example); '' for none. "
                                          "[default: *, every origin, as JevAny]", show_default=False),
    http_dialect: str = typer.Option(None, "--http-dialect", help="Where JevAny's HTTP API and TypeSafe's Jev "
                                     "API differ (score confidence, extra fields, error bodies), whose choice: "
                                     "jevany, or typesafe (strict: the Jev API's reference). "
                                     "[default: jevany]", show_default=False),
    host: str = typer.Option(None, "--host", help="JevAny's --host: with --port, the same as --http HOST:PORT. "
                             "[default: 127.0.0.1 when --port is given]", show_default=False),
    port: int = typer.Option(None, "--port", help="JevAny's --port: with --host, the same as --http HOST:PORT. "
                             "[default: 8008 when --host is given]", show_default=False),
    date_facts: bool = typer.Option(None, "--date-facts/--no-date-facts", help="Add to each state one sentence "
                                    "per pair of absolute dates in it ('August 3, 2026 is 12 days after July "
                                    "22, 2026.'), as JevAny's JEVANY_DATE_FACTS=1. [default: off]",
                                    show_default=False),
    choice_temperature: float = typer.Option(None, "--choice-temperature", help="The choice readout's "
                                             "temperature. [default: the model's, 1.0 for a plain causal LM]",
                                             show_default=False),
    choice_native_weight: float = typer.Option(None, "--choice-native-weight", help="0 to 1: blend the choice "
                                               "readout with the checkpoint's native readout in log space "
                                               "(JevAny's native_weight; a JevAny run directory's head). "
                                               "[default: 0, choice alone]", show_default=False),
    choice_max_tokens: int = typer.Option(None, "--choice-max-tokens", help="Longest choice prompt, the "
                                          "one-token answer included; capped by the context window. "
                                          "[default: 16384]", show_default=False),
    simulate_accelerator: float = typer.Option(None, "--simulate-accelerator", hidden=True,
                                               help="Benchmarks only: every pass takes MS on a simulated "
                                                    "accelerator, attention free (CPU)."),
    letter_temperature: float = typer.Option(None, "--letter-temperature", hidden=True),
    letter_pointer_weight: float = typer.Option(None, "--letter-pointer-weight", hidden=True),
    letter_max_tokens: int = typer.Option(None, "--letter-max-tokens", hidden=True),
    media_root: str = typer.Option(None, "--media-root", help="Directory media URIs resolve in; media is off "
                                   "without it. [default: off]", show_default=False),
    media_max_bytes: int = typer.Option(None, "--media-max-bytes", help="Bytes per media file. "
                                        "[default: 52428800]", show_default=False),
    media_total_bytes: int = typer.Option(None, "--media-total-bytes", help="Media bytes per request; at least "
                                          "--media-max-bytes. [default: 104857600]", show_default=False),
    media_max_pixels: int = typer.Option(None, "--media-max-pixels", help="Pixels per image or video frame. "
                                         "[default: 16777216]", show_default=False),
    media_max_video_frames: int = typer.Option(None, "--media-max-video-frames", help="Frames per video, as "
                                               "the file declares. [default: 3600]", show_default=False),
    media_check_timeout: float = typer.Option(None, "--media-check-timeout", help="Seconds the media checker "
                                              "may spend on one request's files before it is restarted and "
                                              "the request refused. [default: 10]", show_default=False),
    config: Path = typer.Option(None, "--config", help="TOML file of the same settings (snake_case keys). "
                                "[default: none]", show_default=False),
) -> None:
    """Load the model and serve decide requests until SIGTERM or SIGINT, then drain and exit 0.

    SIGHUP (or jevany-ctl reload) reloads: fresh workers load the model named
    now (the --config file is read again), take over once ready, and the old
    ones finish what they hold.

    Every setting can also come from a JEVANY_<NAME> environment variable
    (e.g. JEVANY_MAX_BATCH_SIZE) or the --config file; a flag wins over the
    environment, which wins over the file. Two variables have no flag:
    JEVANY_LOG_LEVEL (DEBUG, INFO, WARNING or ERROR; default INFO) and
    JEVANY_CACHE_DIR (where the demo model is built; default ~/.cache/jevany).
    """
    from jevany_daemon.server import jevany_options
    from jevany_daemon.server.logs import configure_logging, event
    from jevany_daemon.server.settings import SettingsError, parse_mode, resolve
    from jevany_daemon.server.supervisor import StartupError, Supervisor

    try:
        mode = None if socket_mode is None else parse_mode(socket_mode)
    except ValueError:
        typer.echo(f"error: --socket-mode: {socket_mode!r} is not a file mode such as 0660", err=True)
        raise typer.Exit(2) from None
    # JevAny's legacy spellings of the choice readout's options ("letter") still work.
    legacy = (("--choice-temperature", choice_temperature, "--letter-temperature", letter_temperature),
              ("--choice-native-weight", choice_native_weight, "--letter-pointer-weight", letter_pointer_weight),
              ("--choice-max-tokens", choice_max_tokens, "--letter-max-tokens", letter_max_tokens))
    for flag, value, old_flag, old_value in legacy:
        if value is not None and old_value is not None:
            typer.echo(f"error: give at most one of {flag} and its legacy spelling {old_flag}", err=True)
            raise typer.Exit(2)
    try:
        http = jevany_options.http_from_host_port(host, port, http)
    except jevany_options.OptionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    choice_temperature = choice_temperature if letter_temperature is None else letter_temperature
    choice_native_weight = choice_native_weight if letter_pointer_weight is None else letter_pointer_weight
    choice_max_tokens = choice_max_tokens if letter_max_tokens is None else letter_max_tokens
    flags = dict(model=model, readout=readout, model_id=model_id, temperature=temperature, device=device,
                 device_map=device_map,
                 max_memory_gib=max_memory_gib, dtype=dtype, workers=workers,
                 cpu_threads=cpu_threads, heartbeat_timeout=heartbeat_timeout, batch_timeout=batch_timeout,
                 socket_mode=mode,
                 metrics_port=metrics_port, metrics_host=metrics_host, curve_secret_key=curve_secret_key,
                 curve_allowed_clients=curve_allowed_clients, insecure=insecure,
                 bind=tuple(bind or ()), control=control, max_batch_size=max_batch_size,
                 max_packed_tokens=max_packed_tokens, max_state_tokens=max_state_tokens,
                 max_branch_tokens=max_branch_tokens, max_padding_waste=max_padding_waste, layout=layout,
                 batch_policy=batch_policy, prefix_cache=prefix_cache, prefix_min_tokens=prefix_min_tokens,
                 prefix_cache_bytes=prefix_cache_bytes, max_queue=max_queue, max_message_bytes=max_message_bytes,
                 log_requests=log_requests, public_cache_counters=public_cache_counters, http=http,
                 http_token_file=http_token_file, date_facts=date_facts,
                 choice_temperature=choice_temperature, choice_native_weight=choice_native_weight,
                 choice_max_tokens=choice_max_tokens, media_root=media_root, media_max_bytes=media_max_bytes,
                 media_total_bytes=media_total_bytes, media_max_pixels=media_max_pixels,
                 media_max_video_frames=media_max_video_frames, media_check_timeout=media_check_timeout,
                 http_cors_origins=http_cors_origins, http_dialect=http_dialect, lora_scale=lora_scale, merge=merge, merge_bf16=merge_bf16,
                 attn=attn, base_load_path=base_load_path, shape_plan=shape_plan, compile=compile,
                 cuda_graphs=cuda_graphs, cuda_graph_max_tokens=cuda_graph_max_tokens, warmup_limit=warmup_limit,
                 simulate_accelerator=simulate_accelerator)
    try:
        settings = resolve(flags, config)
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    configure_logging()
    if settings.device_auto:
        event(logging.getLogger("jevany.supervisor"), "device_auto", device=settings.device, why=settings.device_auto)
    try:
        code = Supervisor(settings, reload_settings=lambda: resolve(flags, config)).run()
    except StartupError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@app.command("keygen")
def keygen(
    prefix: Path = typer.Argument(..., metavar="OUT_PREFIX", help="Writes OUT_PREFIX.key (public) and "
                                  "OUT_PREFIX.key_secret (secret, mode 0600)."),
) -> None:
    """Write a CurveZMQ key pair, for a daemon (--curve-secret-key) or a client.

    Give a daemon's .key file to its clients; put each client's .key file in
    the daemon's --curve-allowed-clients directory. Existing files are never
    overwritten.
    """
    from jevany_daemon.server.curve import write_keypair

    try:
        public, secret = write_keypair(prefix)
    except (FileExistsError, FileNotFoundError, PermissionError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {public} (public: give it to peers) and {secret} (secret: keep it here)")


def _with_variables(command) -> None:
    """Each setting's help names its JEVANY_ variable, so --help shows where a value may come from."""
    from jevany_daemon.server.settings import ENGINE_FIELDS, LOAD_FIELDS, SERVE_FIELDS

    settings = set(SERVE_FIELDS) | set(ENGINE_FIELDS) | set(LOAD_FIELDS)
    for param in command.params:
        name = param.name
        if name in settings and param.help and "[env:" not in param.help:
            param.help = f"{param.help} [env: JEVANY_{name.upper()}]"


def main() -> None:
    """The console script (and python -m jevany_daemon): the typer app, with the variables in serve's help."""
    command = typer.main.get_command(app)
    _with_variables(command.commands["serve"])
    command(prog_name="jevany-daemon")
