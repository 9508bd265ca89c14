"""Daemon settings: flag > JEVANY_* environment variable > TOML file > default.

Everything is validated (validation.py), in the supervisor, before a worker
starts loading weights, so a typo costs milliseconds rather than a model load.
No torch: the supervisor imports this.
"""
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from jevany_client.endpoints import default_control_endpoint, default_endpoint

from jevany_daemon.config import EngineConfig, LoadOptions, compile_mode

from . import devices as device_names
from . import jevany_options
from .validation import MEDIA_CAPS, SettingsError, validate

AUTO = "auto"

# What a reload may change: everything a worker is built from. The rest
# (sockets, queue, keys, metrics) needs a restart, and a reload says so.
RELOADABLE = ("model", "readout", "model_id", "temperature", "device", "device_auto", "dtype", "workers",
              "cpu_threads", "device_map", "max_memory_gib", "heartbeat_timeout", "batch_timeout", "engine", "load")


@dataclass(frozen=True)
class ServeSettings:
    model: str | None = None          # None: the built-in tiny demo model (random weights)
    readout: str | None = None        # None: the checkpoint's own, or choice for a plain causal LM
    model_id: str | None = None
    temperature: float | None = None  # the native readouts' temperature; None: the checkpoint's
    device: str = AUTO                # one device, or a comma-separated list: one worker each; auto: as JevAny,
                                      # the first CUDA device where one is visible, else cpu (resolve picks)
    device_map: str | None = None     # one of DEVICE_MAPS: one worker spans every GPU in device
    max_memory_gib: float | None = None   # per GPU, for the device map; None: what is free
    dtype: str | None = None          # None: the checkpoint's (bf16 for one trained on a bf16 backbone, else fp32)
    workers: int | None = None        # None: one per listed device
    cpu_threads: int | None = None    # torch threads per CPU worker; None: the cores shared among CPU workers
    heartbeat_timeout: float = 10.0   # a ready worker silent this long is killed and replaced
    batch_timeout: float = 120.0      # a batch unanswered this long means a hung worker
    bind: tuple[str, ...] = ()        # empty: the default ipc endpoint
    control: str | None = None        # None: the default control endpoint; "" disables it
    socket_mode: int | None = None    # chmod for public ipc socket files; None: owner only (0700 directory)
    max_queue: int = 1024
    max_message_bytes: int = 8 << 20
    log_requests: bool = False
    # Prefix-cache counters on the public endpoints too (as JevAny shows them): for one-tenant hosts only,
    # as a hit tells one client what another sent (status.py).
    public_cache_counters: bool = False
    metrics_port: int | None = None   # Prometheus on METRICS_HOST:PORT; 0 picks a free port; None: off
    metrics_host: str = "127.0.0.1"   # the metrics endpoint's address; off loopback it needs --insecure
    curve_secret_key: str | None = None       # server key file; TCP endpoints then require CURVE
    curve_allowed_clients: str | None = None  # directory of allowed clients' public key files
    insecure: bool = False            # allow plain TCP on a non-loopback address
    http: str | None = None           # HOST:PORT of JevAny's HTTP routes (the gateway process); None: off
    http_token_file: str | None = None    # file holding the bearer token HTTP callers must send
    http_cors_origins: str = "*"      # origins a browser page may call the HTTP routes from (comma-separated); "": none
    # Where JevAny's HTTP API and TypeSafe's Jev API differ, whose choice (gateway/dialects.py).
    http_dialect: str = "jevany"
    # Media policy (JevAny's variables and defaults); off unless media_root is set.
    media_root: str | None = None
    media_max_bytes: int = 50 << 20          # per file
    media_total_bytes: int = 100 << 20       # per request; at least media_max_bytes
    media_max_pixels: int = 4096 * 4096      # per image or video frame
    media_max_video_frames: int = 3600
    media_check_timeout: float = 10.0        # seconds one request's media checks may take
    # Benchmarks and tests only: score on a simulated accelerator whose every pass takes this many ms
    # after the host has dispatched it, with attention made free (engine/stream.py); CPU only.
    simulate_accelerator: float | None = None
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


# Settings read from the environment and TOML, with how to parse each.
ENGINE_FIELDS = tuple(f.name for f in fields(EngineConfig))
LOAD_FIELDS = tuple(f.name for f in fields(LoadOptions))
SERVE_FIELDS = tuple(f.name for f in fields(ServeSettings) if f.name not in ("engine", "load", "device_auto"))
_INTS = {"max_queue", "max_message_bytes", "max_batch_size", "max_packed_tokens",
         "max_state_tokens", "max_branch_tokens", "workers", "cpu_threads", "metrics_port",
         "prefix_cache", "prefix_min_tokens", "prefix_cache_bytes", "choice_max_tokens", "cuda_graph_max_tokens",
         *MEDIA_CAPS}
_FLOATS = {"max_padding_waste", "heartbeat_timeout", "batch_timeout", "max_memory_gib", "simulate_accelerator",
           "choice_temperature", "choice_native_weight", "temperature", "media_check_timeout", "lora_scale",
           "warmup_limit"}
_BOOLS = {"log_requests", "insecure", "date_facts", "merge", "merge_bf16", "public_cache_counters", "shape_plan",
          "cuda_graphs"}


def _from_env(env) -> dict:
    found = {}
    for name in SERVE_FIELDS + ENGINE_FIELDS + LOAD_FIELDS:
        raw = env.get(f"JEVANY_{name.upper()}")
        if raw is None or raw == "":
            continue
        found[name] = _parse(name, raw, f"JEVANY_{name.upper()}")
    return found


def _parse(name: str, raw: str, where: str):
    try:
        if name in _INTS:
            return int(raw)
        if name in _FLOATS:
            return float(raw)
        if name in _BOOLS:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if name == "socket_mode":
            return parse_mode(raw)
    except ValueError:
        raise SettingsError(f"{where}: {raw!r} is not a valid {name}") from None
    if name == "bind":
        return tuple(e.strip() for e in raw.split(",") if e.strip())
    return raw


def parse_mode(raw) -> int:
    """'660', '0660', '0o660' or an int → a file mode; read as octal, like chmod."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower().removeprefix("0o")
    if not re.fullmatch(r"[0-7]{3,4}", text):
        raise ValueError(raw)
    return int(text, 8)


def _from_toml(path: Path) -> dict:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError(f"--config: {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"--config {path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(SERVE_FIELDS + ENGINE_FIELDS + LOAD_FIELDS))
    if unknown:
        raise SettingsError(f"--config {path}: unknown settings {unknown}")
    if isinstance(data.get("bind"), str):
        data["bind"] = (data["bind"],)
    elif isinstance(data.get("bind"), list):
        data["bind"] = tuple(data["bind"])
    if isinstance(data.get("device"), list):
        data["device"] = ",".join(map(str, data["device"]))
    if "socket_mode" in data:
        try:
            data["socket_mode"] = parse_mode(data["socket_mode"])
        except ValueError:
            raise SettingsError(f"--config {path}: socket_mode {data['socket_mode']!r} is not a file mode") from None
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
    merged: dict = {}
    origin: dict = {}      # setting -> where its value came from, for errors that name it
    if config_file is not None:
        merged.update(toml := _from_toml(config_file))
        origin.update(dict.fromkeys(toml, f"--config {config_file}"))
    merged.update(environment := _from_env(env))
    origin.update({name: f"JEVANY_{name.upper()}" for name in environment})
    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    merged.update(given)
    origin.update({name: "--" + name.replace("_", "-") for name in given})
    if "compile" in merged:        # JevAny's spellings: 0/off, 1 (reduce-overhead), or a mode
        merged["compile"] = compile_mode(merged["compile"])
    engine = {k: merged.pop(k) for k in ENGINE_FIELDS if k in merged}
    load = {k: merged.pop(k) for k in LOAD_FIELDS if k in merged}
    merged["readout"] = jevany_options.readout(merged.get("readout"))
    try:
        settings = _pick_device(ServeSettings(**merged, engine=EngineConfig(**engine), load=LoadOptions(**load)),
                                cuda_count)
        validate(settings, cuda_count)
    except SettingsError as exc:
        raise SettingsError(_named(str(exc), origin)) from None
    except (TypeError, ValueError) as exc:
        raise SettingsError(_named(str(exc), origin)) from None
    return settings


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
