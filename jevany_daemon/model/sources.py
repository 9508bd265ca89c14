"""What a model source names: a local directory, or a Hugging Face hub id with an optional revision.

No torch: the supervisor checks --model with it before any worker starts,
and a hub id it cannot fetch fails there in seconds: left to the loader, a
host without the network waits a minute and more on the hub's retries.
"""
import os
import re
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")


def split_revision(source: str) -> tuple[str, str | None]:
    """'owner/name@rev' -> ('owner/name', 'rev'); anything without '@' has no revision."""
    name, sep, rev = source.partition("@")
    return (name, rev) if sep and rev else (source, None)


def is_hub_id(source: str) -> bool:
    return bool(_HUB_ID.match(source)) and not Path(source).expanduser().exists()


HUB_PROBE_S = 3.0      # how long a connection to the hub (or the proxy to it) may take to open
_ON = ("1", "true", "yes", "on")


def local_problem(source: str) -> str | None:
    """Why source can name nothing, without loading anything; None when it may be loadable."""
    path = Path(source).expanduser()
    if path.exists():
        return None if path.is_dir() else f"model source is not a directory: {source}"
    return None if is_hub_id(source) else f"model does not exist: {source}"


def hub_problem(source: str, env=os.environ, probe_s: float = HUB_PROBE_S) -> str | None:
    """Why hub id source cannot be loaded here, in one line that says what to type instead; None when
    its files are in the Hugging Face cache, or the hub (or the proxy to it) takes a connection."""
    name, revision = split_revision(source)
    if _cached(name, revision, env):
        return None
    local = f"a directory here ({Path(source).expanduser().absolute()} does not exist)"
    advice = f"for a model on disk give its path (./{source} or an absolute one)"
    if any(env.get(v, "").strip().lower() in _ON for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return (f"model {source} is neither {local} nor in the Hugging Face cache, and HF_HUB_OFFLINE is set; "
                f"{advice}")
    host, port = _hub_address(env)
    if _reachable(host, port, probe_s):
        return None
    return (f"model {source} is neither {local} nor in the Hugging Face cache, and the hub cannot be reached "
            f"({host}:{port} took no connection within {probe_s:g} s); {advice}, or check the network "
            "(HF_ENDPOINT, HTTPS_PROXY)")


def _cache_dir(env) -> Path:
    """The hub's cache as huggingface_hub finds it: HF_HUB_CACHE, else HF_HOME/hub, else the XDG cache."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface" / "hub"


def _cached(name: str, revision: str | None, env) -> bool:
    """A snapshot of the repo is in the cache: the one revision names, or any, as the loader would use."""
    repo = _cache_dir(env) / ("models--" + name.replace("/", "--"))
    if revision is not None and (repo / "refs" / revision).is_file():
        revision = (repo / "refs" / revision).read_text().strip()
    snapshots = repo / "snapshots"
    if revision is not None:
        return (snapshots / revision).is_dir()
    return snapshots.is_dir() and any(snapshots.iterdir())


def _hub_address(env) -> tuple[str, int]:
    """Where a download would connect first: the HTTPS proxy when one is set, else the hub's endpoint."""
    url = urlsplit(env.get("HTTPS_PROXY") or env.get("https_proxy") or env.get("HF_ENDPOINT")
                   or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def _reachable(host: str, port: int, within_s: float) -> bool:
    """A TCP connection opens within within_s, the name's lookup included (which no socket timeout bounds:
    the attempt runs in a thread of its own, left behind if it hangs)."""
    opened = threading.Event()

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=within_s).close()
            opened.set()
        except OSError:
            pass

    threading.Thread(target=attempt, daemon=True, name="hub-probe").start()
    return opened.wait(within_s)
