"""Daemon settings: flag > JEVANY_* environment variable > TOML file > default.

Everything is validated here, in the supervisor, before a worker starts
loading weights, so a typo costs milliseconds rather than a model load.
No torch: the supervisor imports this.
"""
import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from jevany_client.endpoints import default_control_endpoint, default_endpoint

from jevany_daemon.config import EngineConfig

READOUTS = ("choice", "pointer", "lm_token")
DTYPES = ("fp32", "bf16", "fp16")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
_ENDPOINT = re.compile(r"(ipc://.+|tcp://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.*-]+):\d{1,5})")


class SettingsError(ValueError):
    """A setting that cannot work; the message names the setting and where it came from."""


@dataclass(frozen=True)
class ServeSettings:
    model: str | None = None          # None: the built-in tiny demo model (random weights)
    readout: str | None = None        # None: the checkpoint's own, or choice for a plain causal LM
    model_id: str | None = None
    device: str = "cpu"
    dtype: str = "fp32"
    bind: tuple[str, ...] = ()        # empty: the default ipc endpoint
    control: str | None = None        # None: the default control endpoint; "" disables it
    max_queue: int = 1024
    max_message_bytes: int = 8 << 20
    log_requests: bool = False
    engine: EngineConfig = field(default_factory=EngineConfig)

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self.bind or (default_endpoint(),)

    @property
    def control_endpoint(self) -> str | None:
        if self.control is None:
            return default_control_endpoint()
        return self.control or None

    def to_dict(self) -> dict:
        return asdict(self)


# Settings read from the environment and TOML, with how to parse each.
ENGINE_FIELDS = tuple(f.name for f in fields(EngineConfig))
SERVE_FIELDS = ("model", "readout", "model_id", "device", "dtype", "bind", "control",
                "max_queue", "max_message_bytes", "log_requests")
_INTS = {"max_queue", "max_message_bytes", "max_batch_size", "max_packed_tokens",
         "max_state_tokens", "max_branch_tokens"}
_FLOATS = {"max_padding_waste"}
_BOOLS = {"log_requests"}


def _from_env(env) -> dict:
    found = {}
    for name in SERVE_FIELDS + ENGINE_FIELDS:
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
    except ValueError:
        raise SettingsError(f"{where}: {raw!r} is not a valid {name}") from None
    if name == "bind":
        return tuple(e.strip() for e in raw.split(",") if e.strip())
    return raw


def _from_toml(path: Path) -> dict:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError(f"--config: {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"--config {path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(SERVE_FIELDS + ENGINE_FIELDS))
    if unknown:
        raise SettingsError(f"--config {path}: unknown settings {unknown}")
    if isinstance(data.get("bind"), str):
        data["bind"] = (data["bind"],)
    elif isinstance(data.get("bind"), list):
        data["bind"] = tuple(data["bind"])
    return data


def resolve(flags: dict, config_file: Path | None = None, env=os.environ) -> ServeSettings:
    """Merge the sources (flags win) and validate. flags maps setting name → value or None (not given)."""
    merged: dict = {}
    if config_file is not None:
        merged.update(_from_toml(config_file))
    merged.update(_from_env(env))
    merged.update({k: v for k, v in flags.items() if v is not None and v != ()})
    engine = {k: merged.pop(k) for k in ENGINE_FIELDS if k in merged}
    try:
        settings = ServeSettings(**merged, engine=EngineConfig(**engine))
    except (TypeError, ValueError) as exc:
        raise SettingsError(str(exc)) from None
    validate(settings)
    return settings


def validate(s: ServeSettings) -> None:
    if s.readout is not None and s.readout not in READOUTS:
        raise SettingsError(f"readout must be one of {', '.join(READOUTS)}, got {s.readout!r}")
    if s.dtype not in DTYPES:
        raise SettingsError(f"dtype must be one of {', '.join(DTYPES)}, got {s.dtype!r}")
    if not _DEVICE.fullmatch(s.device):
        raise SettingsError(f"device must be cpu, cuda or cuda:N, got {s.device!r}")
    if s.model is not None and not s.model.strip():
        raise SettingsError("model must not be empty")
    for name in ("max_queue", "max_message_bytes"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SettingsError(f"{name} must be an integer >= 1, got {value!r}")
    endpoints = list(s.endpoints) + ([s.control_endpoint] if s.control_endpoint else [])
    for endpoint in endpoints:
        if not isinstance(endpoint, str) or not _ENDPOINT.fullmatch(endpoint):
            raise SettingsError(f"endpoint {endpoint!r} must be ipc://PATH or tcp://HOST:PORT")
    if len(set(endpoints)) != len(endpoints):
        raise SettingsError("the control endpoint must differ from every public endpoint")
