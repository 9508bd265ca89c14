"""Daemon settings: flag > JEVANY_* environment variable > TOML file > default.

Everything is validated here, in the supervisor, before a worker starts
loading weights, so a typo costs milliseconds rather than a model load.
No torch: the supervisor imports this.
"""
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from jevany_client.endpoints import default_control_endpoint, default_endpoint

from jevany_daemon.config import DEVICE_MAPS, EngineConfig, LoadOptions
from jevany_daemon.model.sources import local_problem

from . import devices as device_names
from . import jevany_options

READOUTS = ("choice", "pointer", "lm_token", "native")     # native: a checkpoint's own (JevAny's name)
DTYPES = ("fp32", "bf16", "fp16")
AUTO = "auto"
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
_ENDPOINT = re.compile(r"(ipc://.+|tcp://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.*-]+):\d{1,5})")
_TCP_HOST = re.compile(r"tcp://\[?([^\]]*?)\]?:\d+")

# What a reload may change: everything a worker is built from. The rest
# (sockets, queue, keys, metrics) needs a restart, and a reload says so.
RELOADABLE = ("model", "readout", "model_id", "temperature", "device", "device_auto", "dtype", "workers",
              "cpu_threads", "device_map", "max_memory_gib", "heartbeat_timeout", "batch_timeout", "engine", "load")
MEDIA_CAPS = ("media_max_bytes", "media_total_bytes", "media_max_pixels", "media_max_video_frames")


class SettingsError(ValueError):
    """A setting that cannot work; the message names the setting and where it came from."""


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
         "prefix_cache", "prefix_min_tokens", "prefix_cache_bytes", "choice_max_tokens", *MEDIA_CAPS}
_FLOATS = {"max_padding_waste", "heartbeat_timeout", "batch_timeout", "max_memory_gib", "simulate_accelerator",
           "choice_temperature", "choice_native_weight", "temperature", "media_check_timeout", "lora_scale"}
_BOOLS = {"log_requests", "insecure", "date_facts", "merge", "merge_bf16", "public_cache_counters"}


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


def validate(s: ServeSettings, cuda_count: Callable[[], int] = device_names.visible_cuda_count) -> None:
    _validate_model(s)
    _validate_device_map(s)
    _validate_pool(s)
    _validate_devices_exist(s, cuda_count)
    for name in ("max_queue", "max_message_bytes"):
        _positive_int(name, getattr(s, name))
    _validate_endpoints(s)
    _validate_security(s)
    _validate_http(s)
    _validate_media(s)
    if s.metrics_port is not None and (isinstance(s.metrics_port, bool) or not isinstance(s.metrics_port, int)
                                       or not 0 <= s.metrics_port <= 65535):
        raise SettingsError(f"metrics_port must be a port number (0 picks a free one), got {s.metrics_port!r}")
    _validate_metrics_host(s)
    if s.socket_mode is not None and not (isinstance(s.socket_mode, int) and 0 <= s.socket_mode <= 0o777):
        raise SettingsError(f"socket_mode must be a file mode such as 0660, got {s.socket_mode!r}")


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingsError(f"{name} must be an integer >= 1, got {value!r}")


def _validate_model(s: ServeSettings) -> None:
    if s.readout is not None and s.readout not in READOUTS:
        raise SettingsError(f"readout must be one of {', '.join(READOUTS)}, got {s.readout!r}")
    if s.dtype is not None and s.dtype not in DTYPES:
        raise SettingsError(f"dtype must be one of {', '.join(DTYPES)}, got {s.dtype!r}")
    t = s.temperature
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
        raise SettingsError(f"temperature must be a finite number > 0, got {t!r}")
    if s.model is not None and not s.model.strip():
        raise SettingsError("model must not be empty")
    if s.model is not None and (problem := local_problem(s.model)):
        raise SettingsError(problem)      # before a worker starts: a path that is not there is a setting
    jevany_options.check_readout_rules(s.model, s.readout, t)
    if s.load.base_load_path is not None and not Path(s.load.base_load_path).expanduser().is_dir():
        raise SettingsError(f"base_load_path {s.load.base_load_path} is not a directory (JevAny's "
                            "JEVANY_BASE_LOAD_PATH: a local copy of the checkpoint's base model)")
    if s.engine.choice_native_weight > 0:
        if s.readout != "choice":
            raise SettingsError("choice_native_weight blends the choice readout with the checkpoint's own "
                                "readout; it needs readout choice (--readout choice)")
        if s.model is None or (Path(s.model).is_dir() and not (Path(s.model) / "head.pt").is_file()):
            raise SettingsError(f"choice_native_weight blends in a JevAny checkpoint's own readout, and "
                                f"{s.model or 'the demo model'} has none (no head.pt): a plain causal LM "
                                "has nothing to blend with")


def _validate_pool(s: ServeSettings) -> None:
    devices = s.devices
    if "mps" in devices:
        raise SettingsError("device mps (Apple's GPU, which JevAny can use) is not served by jevany-daemon; "
                            "give --device cpu, or cuda on a host with an NVIDIA GPU")
    for device in devices:
        if not _DEVICE.fullmatch(device):
            raise SettingsError(f"device must be cpu, cuda or cuda:N (or a comma-separated list), got {s.device!r}")
    if len(set(devices)) != len(devices):
        raise SettingsError(f"device {s.device!r} names one device twice (cuda is cuda:0); "
                            "use --workers N for several workers on one device")
    if s.workers is not None:
        _positive_int("workers", s.workers)
        if s.device_map is None and s.workers % len(devices):
            raise SettingsError(f"workers={s.workers} cannot be spread evenly over the {len(devices)} devices "
                                f"{s.device!r}; give a multiple of {len(devices)}, or one device")
    if s.cpu_threads is not None:
        _positive_int("cpu_threads", s.cpu_threads)
    value = s.simulate_accelerator
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise SettingsError(f"simulate_accelerator must be a number of ms > 0, got {value!r}")
        if set(devices) != {"cpu"}:
            raise SettingsError(f"simulate_accelerator runs on the CPU only; device is {s.device!r}")
    for name in ("heartbeat_timeout", "batch_timeout"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise SettingsError(f"{name} must be a number of seconds > 0, got {value!r}")


def _validate_device_map(s: ServeSettings) -> None:
    if s.device_map is None:
        if s.max_memory_gib is not None:
            raise SettingsError("max_memory_gib caps each GPU of a worker that spans several; "
                                "it needs device_map (--device-map auto)")
        return
    if s.device_map not in DEVICE_MAPS:
        raise SettingsError(f"device_map must be one of {', '.join(DEVICE_MAPS)}, got {s.device_map!r}")
    if "cpu" in s.devices:
        raise SettingsError(f"device_map spreads one model over GPUs, and device {s.device!r} names the CPU; "
                            "give --device cuda (every GPU) or a list such as cuda:0,cuda:1")
    if s.workers not in (None, 1):
        raise SettingsError(f"workers must be 1 with device_map: the one worker spans every GPU in device "
                            f"{s.device!r}, and a second would need the same GPUs (got workers={s.workers})")
    value = s.max_memory_gib
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or value <= 0):
        raise SettingsError(f"max_memory_gib must be a number of GiB > 0 (per GPU), got {value!r}")


def _validate_devices_exist(s: ServeSettings, cuda_count: Callable[[], int]) -> None:
    if not any(device_names.is_cuda(d) for d in s.devices):
        return
    try:
        count = cuda_count()
    except TimeoutError as exc:
        raise SettingsError(f"device {s.device!r} cannot be checked: {exc}") from None
    why = device_names.missing(list(s.devices), count)
    if why:
        raise SettingsError(f"device {why}")


def _validate_endpoints(s: ServeSettings) -> None:
    endpoints = list(s.endpoints) + ([s.control_endpoint] if s.control_endpoint else [])
    for endpoint in endpoints:
        if not isinstance(endpoint, str) or not _ENDPOINT.fullmatch(endpoint):
            raise SettingsError(f"endpoint {endpoint!r} must be ipc://PATH or tcp://HOST:PORT")
    if len(set(endpoints)) != len(endpoints):
        raise SettingsError("the control endpoint must differ from every public endpoint")
    control = s.control_endpoint or ""
    if control.startswith("ipc://@"):
        # A Linux abstract socket has no file, so no mode: every local user could drain or reload.
        raise SettingsError(f"control {control} is an abstract socket, which every local user may connect to; "
                            "give the control endpoint a path (ipc:///run/jevany/control.sock)")


def _validate_security(s: ServeSettings) -> None:
    if (s.curve_secret_key is None) != (s.curve_allowed_clients is None):
        raise SettingsError("curve_secret_key and curve_allowed_clients go together: the server's key pair "
                            "and the directory of client public keys it accepts")
    if s.curve:
        if not Path(s.curve_secret_key).is_file():
            raise SettingsError(f"curve_secret_key: {s.curve_secret_key} is not a file")
        if not Path(s.curve_allowed_clients).is_dir():
            raise SettingsError(f"curve_allowed_clients: {s.curve_allowed_clients} is not a directory")
        return
    endpoints = list(s.endpoints) + ([s.control_endpoint] if s.control_endpoint else [])
    exposed = [e for e in endpoints if not is_loopback(e)]
    if exposed and not s.insecure:
        raise SettingsError(f"{exposed[0]} is reachable from the network without CurveZMQ, so anyone there could "
                            "use the model; give --curve-secret-key and --curve-allowed-clients, bind 127.0.0.1, "
                            "or pass --insecure")
    control = s.control_endpoint or ""
    if control.startswith("tcp://") and not s.insecure:
        raise SettingsError(f"control {control} would let every local user drain or reload the daemon (TCP has "
                            "no file mode); use an ipc path, CurveZMQ keys, or pass --insecure")


_HTTP = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})")


def http_address(value: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 in brackets) → (host, port); ValueError names the form expected."""
    match = _HTTP.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None or not 0 <= int(match.group(2)) <= 65535:
        raise ValueError(f"http must be HOST:PORT such as 127.0.0.1:8008, got {value!r}")
    return match.group(1).strip("[]"), int(match.group(2))


_ORIGIN = re.compile(r"https?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?")


def cors_origins(value: str) -> list[str]:
    """http_cors_origins as the origins a browser page may call from: ["*"] (any, JevAny's), a list, or []."""
    origins = [o.strip() for o in value.split(",") if o.strip()] if isinstance(value, str) else None
    if origins is None or (origins != ["*"] and not all(_ORIGIN.fullmatch(o) for o in origins)):
        raise ValueError(f"http_cors_origins must be *, empty (none), or origins such as "
                         f"https://app.example:8443 separated by commas, got {value!r}")
    return origins


def _validate_http(s: ServeSettings) -> None:
    cors_origins(s.http_cors_origins)
    if s.http is None:
        if s.http_token_file is not None:
            raise SettingsError("http_token_file guards the HTTP routes; it needs http (--http HOST:PORT)")
        return
    try:
        host, port = http_address(s.http)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    if s.http_token_file is not None:
        try:
            token = Path(s.http_token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"http_token_file: cannot read {s.http_token_file}: {exc}") from None
        if not token:
            raise SettingsError(f"http_token_file: {s.http_token_file} is empty")
    elif not is_loopback(f"tcp://{host}:{port}") and not s.insecure:
        raise SettingsError(f"http {s.http} is reachable from the network without a token, so anyone there "
                            "could use the model; give --http-token-file, bind 127.0.0.1, or pass --insecure")


def _validate_media(s: ServeSettings) -> None:
    for name in MEDIA_CAPS:
        _positive_int(name, getattr(s, name))
    if s.media_total_bytes < s.media_max_bytes:
        raise SettingsError(f"media_total_bytes ({s.media_total_bytes}) must be at least media_max_bytes "
                            f"({s.media_max_bytes}): one file may take the whole request's allowance")
    if s.media_root is not None and not s.media_root.strip():
        raise SettingsError("media_root must not be empty; leave it unset to turn media off")
    if s.media_root is not None and not Path(s.media_root).is_dir():
        raise SettingsError(f"media_root {s.media_root} is not a directory")
    t = s.media_check_timeout
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise SettingsError(f"media_check_timeout must be a number of seconds > 0, got {t!r}")


def _validate_metrics_host(s: ServeSettings) -> None:
    host = s.metrics_host
    try:
        address = ipaddress.ip_address(host) if host != "localhost" else ipaddress.ip_address("127.0.0.1")
    except (TypeError, ValueError):
        raise SettingsError(f"metrics_host must be an IP address such as 127.0.0.1 or ::1, got {host!r}") from None
    if s.metrics_port is not None and not address.is_loopback and not s.insecure:
        raise SettingsError(f"metrics_host {host} would serve the metrics, unauthenticated, to anyone who can "
                            "reach it; bind 127.0.0.1 (and scrape through something that authenticates), or "
                            "pass --insecure")


def is_loopback(endpoint: str) -> bool:
    """True for ipc endpoints and TCP on a loopback address; hostnames and wildcards count as exposed."""
    match = _TCP_HOST.fullmatch(endpoint)
    if match is None:
        return not endpoint.startswith("tcp://")
    host = match.group(1)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
