"""Daemon settings: flag > JEVANY_* environment variable > TOML file > default.

ServeSettings declares the daemon's own settings, config.py the engine's and the loader's
(declaration.py says how); SETTINGS lists them all, and the environment, TOML and flags are
read by those declarations. Everything is validated (validation.py), in the supervisor,
before a worker starts loading weights, so a typo costs milliseconds rather than a model load.
No torch: the supervisor imports this.
"""
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from jevany_client.endpoints import default_control_endpoint, default_endpoint

from jevany_daemon.config import DEVICE_MAPS, EngineConfig, LoadOptions
from jevany_daemon.declaration import (GROUPS, Rule, declared, integer, number, one_of, read_environment,
                                       reloadable, setting)
from jevany_daemon.http_options import DIALECTS

from . import device_names
from . import jevany_options
from .validation import DTYPES, READOUTS, SettingsError, validate

AUTO = "auto"


def parse_mode(raw) -> int:
    """'660', '0660', '0o660' or an int → a file mode; read as octal, like chmod."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower().removeprefix("0o")
    if not re.fullmatch(r"[0-7]{3,4}", text):
        raise ValueError("a file mode such as 0660")
    return int(text, 8)


def _endpoints_from_toml(value):
    """TOML's bind: one endpoint, or a list of them."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _devices_from_toml(value):
    """TOML's device: a list of devices, or one string as a flag gives it."""
    return ",".join(map(str, value)) if isinstance(value, list) else value


@dataclass(frozen=True)
class ServeSettings:
    """Everything the daemon is started with. Each field but the last three declares its setting
    (declaration.py); engine and load hold the engine's and the loader's, declared in config.py."""
    # --- the model, its workers and their devices: a reload takes these ---
    model: str | None = reloadable(
        None, "Local model directory, JevAny run directory or hub id (--checkpoint and --run are JevAny's "
        "names).", group="model", shown_default="a built-in tiny demo model with random weights",
        jevany_flags=("--checkpoint", "--run"))
    readout: str | None = reloadable(
        None, "choice | pointer | lm_token, or JevAny's native (the checkpoint's own) and letter (choice).",
        group="model", shown_default="the checkpoint's own readout, or choice for a plain causal LM",
        normalise=jevany_options.readout, rule=one_of(READOUTS))
    model_id: str | None = reloadable(
        None, "Name replies give as 'model' (--model-name is JevAny's name).", group="model",
        shown_default="from the source", jevany_flags=("--model-name",))
    temperature: float | None = reloadable(
        None, "The native readouts' (pointer, lm_token) temperature, as JevAny's JEVANY_TEMPERATURE; not with "
        "the choice readout (--choice-temperature).", group="model", shown_default="the checkpoint's, from "
        "head.pt", rule=number())
    # A comma-separated list is one worker each; auto is made concrete by resolve (_pick_device).
    device: str = reloadable(
        AUTO, "auto, cpu, cuda (= cuda:0) or cuda:N; a comma-separated list (cuda:0,cuda:1) starts one worker "
        "per device. Each worker sees only its own GPU(s). auto: the first CUDA device where one is visible, "
        "else cpu, as JevAny picks (the log says which).", group="model", from_toml=_devices_from_toml,
        more="A GPU the host lacks is a settings error (exit 2); the log says why auto chose as it did "
        "(`event=device_auto`).")
    device_map: str | None = reloadable(
        None, "auto | balanced | balanced_low_0 | sequential: one worker spreads the model over every GPU in "
        "--device (cuda: all of them), for a checkpoint too big for one GPU; placement by Accelerate. "
        "--workers must then be 1 (its default).", group="model", shown_default="off, one whole model per GPU",
        rule=one_of(DEVICE_MAPS))
    max_memory_gib: float | None = reloadable(
        None, "With --device-map: GiB of weights each GPU may take; lower it to leave room for activations. A "
        "model that does not fit fails to load (never offloaded to CPU or disk).", group="model",
        shown_default="each GPU's free memory", rule=number(must="must be a number of GiB > 0 (per GPU)"))
    workers: int | None = reloadable(
        None, "Worker processes, each with its own copy of the model, fed from one queue; spread evenly over "
        "--device.", group="model", shown_default="one per device", rule=integer(1))
    # Without it torch would give every CPU worker all the cores (worker_settings shares them out).
    cpu_threads: int | None = reloadable(
        None, "Torch threads of each CPU worker. Lower it when clients or other work share the host: a forward "
        "pass split over threads waits for the slowest.", group="model",
        shown_default="the cores divided among the CPU workers", rule=integer(1),
        more="See [Measuring](MEASURING.md).")
    # Infinity passes the rule: a timeout that never fires.
    heartbeat_timeout: float = reloadable(
        10.0, "Seconds a ready worker may go without a heartbeat before it is killed and replaced.",
        group="model", rule=number("seconds", finite=False))
    batch_timeout: float = reloadable(
        120.0, "Seconds one batch may take before its worker counts as hung, is killed and replaced; its "
        "requests get worker_lost.", group="model", rule=number("seconds", finite=False))
    dtype: str | None = reloadable(
        None, "fp32, bf16 or fp16.", group="model", shown_default="the checkpoint's: bf16 for one trained on a "
        "bf16 backbone (head.pt weights_dtype), else fp32", rule=one_of(DTYPES))

    # --- sockets and the service around the model: these need a restart ---
    bind: tuple[str, ...] = setting(
        (), "Public endpoint, ipc://PATH or tcp://HOST:PORT; repeat for several.", group="sockets",
        shown_default="ipc://$XDG_RUNTIME_DIR/jevany/daemon.sock", from_toml=_endpoints_from_toml)
    socket_mode: int | None = setting(
        None, "File mode for public ipc sockets, e.g. 0660 so the daemon's group may connect. The control "
        "socket stays 0600.", group="sockets", shown_default="leave the umask's", parse=parse_mode,
        from_toml=parse_mode, rule=Rule(lambda v: isinstance(v, int) and 0 <= v <= 0o777,
                                        "must be a file mode such as 0660"))
    control: str | None = setting(
        None, "Control endpoint for clear_cache, drain, reload; '' disables it.", group="sockets",
        shown_default="ipc://$XDG_RUNTIME_DIR/jevany/control.sock")
    max_queue: int = setting(
        1024, "Requests that may wait; beyond it replies are 'overloaded' at once.", group="service",
        rule=integer(1))
    max_message_bytes: int = setting(
        8 << 20, "Bigger messages are refused by ZeroMQ before the daemon reads them.", group="service",
        rule=integer(1))
    log_requests: bool = setting(False, "One log line per request.", group="service")
    replace_slow_workers: bool = reloadable(
        False, "Replace a worker that has run at least twice as slow as its own best for a minute, as a reload "
        "does (no request is lost); at most once in ten minutes. Off: such a worker is only reported "
        "(log event worker_slow, status, metrics).", group="service")
    # Off by default: a hit tells one client what another sent (status.py).
    public_cache_counters: bool = setting(
        False, "Show the prefix cache's hits and misses on the public endpoints and /v1/models, as JevAny does. "
        "Only where every client is one tenant: a hit tells one client what another sent.", group="service",
        shown_default="off: on the control endpoint only")
    metrics_port: int | None = setting(
        None, "Serve Prometheus metrics on http://METRICS_HOST:PORT/metrics; 0 picks a free port (see status).",
        group="service", shown_default="off", rule=integer(0, 65535, "must be a port number (0 picks a free one)"))
    metrics_host: str = setting(
        "127.0.0.1", "Address the metrics listen on; other than loopback it needs --insecure (they are "
        "unauthenticated).", group="service")
    curve_secret_key: str | None = setting(
        None, "Server key file (keygen's PREFIX.key_secret); TCP endpoints then require CurveZMQ.",
        group="service", shown_default="none, plain TCP on loopback only")
    curve_allowed_clients: str | None = setting(
        None, "Directory of client public key files (*.key); only those clients get replies. A reload reads "
        "the directory again; another directory needs a restart.", group="service", shown_default="none")
    insecure: bool = setting(
        False, "Allow plain TCP on a non-loopback address (anyone who reaches it can use the model).",
        group="service")
    http: str | None = setting(
        None, "HOST:PORT to serve JevAny's HTTP routes on (POST /v1/systemone, GET /v1/models, GET /health), "
        "from a gateway process sharing the same queue and batches. A non-loopback address needs "
        "--http-token-file or --insecure.", group="service", shown_default="off",
        more="JevAny's `--host` and `--port` set it too; see [Coming from JevAny](COMING-FROM-JEVANY.md).")
    http_token_file: str | None = setting(
        None, "File holding the token HTTP callers must send as 'Authorization: Bearer TOKEN'.",
        group="service", shown_default="none")
    http_cors_origins: str = setting(
        "*", "Origins a browser page may call the HTTP routes from, comma-separated (https://app.example); '' "
        "for none.", group="service", shown_default="*, every origin, as JevAny")
    # Where JevAny's HTTP API and TypeSafe's Jev API differ, whose choice (gateway/dialects.py).
    http_dialect: str = setting(
        "jevany", "Where JevAny's HTTP API and TypeSafe's Jev API differ (score confidence, extra fields, error "
        "bodies), whose choice: jevany, or typesafe (strict: the Jev API's reference).", group="service",
        rule=one_of(DIALECTS), more="See [The Jev API](JEV-API.md).")

    # --- media policy (JevAny's variables and defaults); off unless media_root is set ---
    media_root: str | None = setting(
        None, "Directory media URIs resolve in (it must exist); media is off without it.", group="media",
        shown_default="off",
        more="Each request's files are checked by a media checker process before it is queued; see "
        "[Requests](REQUESTS.md).")
    media_max_bytes: int = setting(50 << 20, "Bytes per media file.", group="media", rule=integer(1))
    media_total_bytes: int = setting(
        100 << 20, "Media bytes per request; at least --media-max-bytes.", group="media", rule=integer(1))
    media_max_pixels: int = setting(
        4096 * 4096, "Pixels per image or video frame.", group="media", rule=integer(1))
    media_max_video_frames: int = setting(
        3600, "Frames per video, as the file declares.", group="media", rule=integer(1))
    media_check_timeout: float = setting(
        10.0, "Seconds the media checker may spend on one request's files before it is restarted and the "
        "request refused.", group="media", rule=number("seconds"))

    # Benchmarks and tests only: score on a simulated accelerator whose every pass takes this many ms
    # after the host has dispatched it, with attention made free (engine/stream.py); CPU only.
    simulate_accelerator: float | None = setting(
        None, "Benchmarks only: every pass takes MS on a simulated accelerator, attention free (CPU).",
        group="benchmarks", shown_default="off", hidden=True, rule=number("ms"))

    engine: EngineConfig = field(default_factory=EngineConfig)
    load: LoadOptions = field(default_factory=LoadOptions)
    device_auto: str | None = None    # why --device auto chose device (resolve fills it in); None: it was named

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self.bind or (default_endpoint(),)

    @property
    def control_endpoint(self) -> str | None:
        if self.control is None:
            return default_control_endpoint()
        return self.control or None

    @property
    def devices(self) -> tuple[str, ...]:
        if self.device.strip() == AUTO:       # built directly, not by resolve: pick now, as resolve would
            return _pick_device(self, device_names.visible_cuda_count).devices
        names = tuple(d.strip() for d in self.device.split(","))
        if self.device_map is not None and names == ("cuda",):
            return names      # every GPU the host shows, however many
        return tuple(device_names.normalise(d) for d in names)

    @property
    def worker_count(self) -> int:
        if self.workers is not None:
            return self.workers
        return 1 if self.device_map is not None else len(self.devices)

    def worker_devices(self) -> list[str]:
        """The device of each worker: the list, repeated as often as --workers asks; under a
        device map, the whole list for the one worker that spans it."""
        devices = self.devices
        if self.device_map is not None:
            return [",".join(devices)] * self.worker_count
        return [devices[i % len(devices)] for i in range(self.worker_count)]

    @property
    def curve(self) -> bool:
        return self.curve_secret_key is not None

    def worker_settings(self, device: str) -> dict:
        """What one worker process is told: these settings with its own device, and for a CPU
        worker its threads: cpu_threads, else its share of the cores (torch would otherwise
        give every worker all of them)."""
        threads = None
        if device == "cpu":
            sharing = self.worker_devices().count("cpu")
            threads = self.cpu_threads or max(1, (os.cpu_count() or 1) // sharing)
        return {**asdict(self), "device": device, "cpu_threads": threads}

    def to_dict(self) -> dict:
        return asdict(self)

    def with_reloaded(self, fresh: "ServeSettings") -> tuple["ServeSettings", list[str]]:
        """These settings with fresh's model settings; also the names that differ but need a restart."""
        taken = replace(self, **{name: getattr(fresh, name) for name in RELOADABLE})
        ignored = [f.name for f in fields(self) if f.name not in RELOADABLE
                   and getattr(fresh, f.name) != getattr(self, f.name)]
        return taken, ignored


def _in_groups(*classes) -> tuple:
    """Every setting the classes declare, by group (GROUPS' order), then in field order."""
    every = [s for cls in classes for s in declared(cls)]
    return tuple(sorted(every, key=lambda s: GROUPS.index(s.group)))


SETTINGS = _in_groups(ServeSettings, LoadOptions, EngineConfig)
SERVE_FIELDS = tuple(s.name for s in declared(ServeSettings))
ENGINE_FIELDS = tuple(s.name for s in declared(EngineConfig))
LOAD_FIELDS = tuple(s.name for s in declared(LoadOptions))
# What a reload may change: everything a worker is built from (the engine and load options whole,
# and how auto picked the device). The rest (sockets, queue, keys, metrics) needs a restart, and a
# reload says so.
RELOADABLE = (*(s.name for s in declared(ServeSettings) if s.reload), "device_auto", "engine", "load")


def _from_toml(path: Path) -> dict:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError(f"--config: {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"--config {path}: not valid TOML: {exc}") from None
    takes = {s.name: s for s in SETTINGS if s.toml}
    unknown = sorted(set(data) - set(takes))
    if unknown:
        raise SettingsError(f"--config {path}: unknown settings {unknown}")
    for name, value in data.items():
        if takes[name].from_toml is not None:
            try:
                data[name] = takes[name].from_toml(value)
            except ValueError as exc:
                raise SettingsError(f"--config {path}: {name} {value!r} is not {exc}") from None
    return data


def resolve(flags: dict, config_file: Path | None = None, env=os.environ,
            cuda_count: Callable[[], int] = device_names.visible_cuda_count) -> ServeSettings:
    """Merge the sources (flags win) and validate. flags maps setting name → value or None (not given).

    cuda_count is asked only when a CUDA device is named, or auto picks one; tests give a fake host.
    """
    try:
        jevany_options.refuse_unoffered(env)
    except jevany_options.OptionError as exc:
        raise SettingsError(str(exc)) from None
    merged, origin = _merged(flags, config_file, env)
    engine = {k: merged.pop(k) for k in ENGINE_FIELDS if k in merged}
    load = {k: merged.pop(k) for k in LOAD_FIELDS if k in merged}
    try:
        settings = _pick_device(ServeSettings(**merged, engine=EngineConfig(**engine), load=LoadOptions(**load)),
                                cuda_count)
        validate(settings, cuda_count)
    except (TypeError, ValueError) as exc:     # SettingsError among them
        raise SettingsError(_named(str(exc), origin)) from None
    return settings


def _merged(flags: dict, config_file: Path | None, env) -> tuple[dict, dict]:
    """What every source gives, a flag over a variable over the file; and where each value came from,
    for errors that name it."""
    toml = _from_toml(config_file) if config_file is not None else {}
    environment = read_environment(SETTINGS, env, SettingsError)
    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    merged = {**toml, **environment, **given}
    declared = {s.name: s for s in SETTINGS}
    origin = {**dict.fromkeys(toml, f"--config {config_file}"),
              **{name: declared[name].variable for name in environment},
              **{name: declared[name].cli_flag if name in declared else "--" + name.replace("_", "-")
                 for name in given}}
    for s in SETTINGS:      # JevAny's spellings (compile's 1, readout's letter), whichever source won
        if s.normalise is not None and s.name in merged:
            merged[s.name] = s.normalise(merged[s.name])
    return merged, origin


def _pick_device(s: ServeSettings, cuda_count: Callable[[], int]) -> ServeSettings:
    """--device auto made concrete: the first CUDA device where one is visible (every GPU under a device map)."""
    if not isinstance(s.device, str) or s.device.strip() != AUTO:
        return s
    try:
        device, why = device_names.auto_device(cuda_count())
    except TimeoutError as exc:
        raise SettingsError(f"device auto cannot tell whether a GPU is here: {exc}; give --device cpu or cuda") \
            from None
    if s.device_map is not None:
        if device == "cpu":
            raise SettingsError(f"device_map spreads one model over GPUs, and device auto found none ({why}); "
                                "give --device cuda on a host with GPUs")
        device = "cuda"     # every visible GPU
    return replace(s, device=device, device_auto=why)


def _named(message: str, origin: dict) -> str:
    """The message, led by the flag, variable or file the offending value came from."""
    name = message.split(" ", 1)[0].rstrip(":")
    return f"{origin[name]}: {message}" if name in origin else message
