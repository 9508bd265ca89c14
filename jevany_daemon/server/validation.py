"""The rules a daemon's settings must meet, checked before any worker starts loading weights.

resolve (settings.py) merges the sources, then calls validate; an error names
the setting, and resolve adds where its value came from. Each setting's own
rule (a range, a list of choices) is declared on its field and checked first;
here are the rules that take more than one value, the host or the filesystem.
No torch.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from jevany_daemon.declaration import check
from jevany_daemon.http_options import cors_origins
from jevany_daemon.model.sources import hub_problem, is_hub_id, local_problem

from . import device_names
from . import jevany_options

if TYPE_CHECKING:
    from .settings import ServeSettings

READOUTS = ("choice", "pointer", "lm_token", "native")     # native: a checkpoint's own (JevAny's name)
DTYPES = ("fp32", "bf16", "fp16")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
_ENDPOINT = re.compile(r"(ipc://.+|tcp://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.*-]+):\d{1,5})")
_TCP_HOST = re.compile(r"tcp://\[?([^\]]*?)\]?:\d+")


class SettingsError(ValueError):
    """A setting that cannot work; the message names the setting and where it came from."""


def validate(s: ServeSettings, cuda_count: Callable[[], int] = device_names.visible_cuda_count) -> None:
    check(s, SettingsError)     # each setting's declared rule; the engine and load options checked theirs
    _validate_model(s)
    _validate_device_map(s)
    _validate_pool(s)
    _validate_devices_exist(s, cuda_count)
    _validate_plan(s)
    _validate_endpoints(s)
    _validate_security(s)
    _validate_http(s)
    _validate_media(s)
    _validate_metrics_host(s)


def _validate_model(s: ServeSettings) -> None:
    if s.model is not None and not s.model.strip():
        raise SettingsError("model must not be empty")
    if s.model is not None and (problem := local_problem(s.model)):
        raise SettingsError(problem)      # before a worker starts: a path that is not there is a setting
    if s.model is not None and is_hub_id(s.model) and (problem := hub_problem(s.model)):
        raise SettingsError(problem)
    jevany_options.check_readout_rules(s.model, s.readout, s.temperature)
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
    if s.workers is not None and s.device_map is None and s.workers % len(devices):
        raise SettingsError(f"workers={s.workers} cannot be spread evenly over the {len(devices)} devices "
                            f"{s.device!r}; give a multiple of {len(devices)}, or one device")
    if s.simulate_accelerator is not None and set(devices) != {"cpu"}:
        raise SettingsError(f"simulate_accelerator runs on the CPU only; device is {s.device!r}")


def _validate_plan(s: ServeSettings) -> None:
    """CUDA graphs need a CUDA device; graphs and compiled passes, one GPU a worker (not a device map)."""
    e = s.engine
    if e.cuda_graphs and "cpu" in s.devices:
        raise SettingsError(f"cuda_graphs captures CUDA graphs and needs CUDA devices; device is "
                            f"{','.join(s.devices)}. On a CPU, --shape-plan runs the same fixed shapes eagerly")
    if s.device_map is not None and (e.cuda_graphs or e.compile is not None):
        which = "cuda_graphs" if e.cuda_graphs else "compile"
        raise SettingsError(f"{which} needs the whole model on one GPU a worker; it cannot run with device_map")


def _validate_device_map(s: ServeSettings) -> None:
    if s.device_map is None:
        if s.max_memory_gib is not None:
            raise SettingsError("max_memory_gib caps each GPU of a worker that spans several; "
                                "it needs device_map (--device-map auto)")
        return
    if "cpu" in s.devices:
        raise SettingsError(f"device_map spreads one model over GPUs, and device {s.device!r} names the CPU; "
                            "give --device cuda (every GPU) or a list such as cuda:0,cuda:1")
    if s.workers not in (None, 1):
        raise SettingsError(f"workers must be 1 with device_map: the one worker spans every GPU in device "
                            f"{s.device!r}, and a second would need the same GPUs (got workers={s.workers})")


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
    if s.media_total_bytes < s.media_max_bytes:
        raise SettingsError(f"media_total_bytes ({s.media_total_bytes}) must be at least media_max_bytes "
                            f"({s.media_max_bytes}): one file may take the whole request's allowance")
    if s.media_root is not None and not s.media_root.strip():
        raise SettingsError("media_root must not be empty; leave it unset to turn media off")
    if s.media_root is not None and not Path(s.media_root).is_dir():
        raise SettingsError(f"media_root {s.media_root} is not a directory")


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
