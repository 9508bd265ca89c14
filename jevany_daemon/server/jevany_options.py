"""JevAny's serve options that the daemon takes under its own terms, and those it refuses at start.

JevAny's `jevany serve` flags, its JEVANY_* variables and its rules for the
choice readout: each either does here what it does in JevAny (settings.py
reads most of them under the same names), or is refused before any weights
load, naming the option and what to use instead. Nothing is silently ignored.
No torch: the supervisor checks these.
"""
from pathlib import Path

# JevAny's readout names: native is a checkpoint's own head (pointer or lm_token), letter the
# legacy name of choice.
READOUT_ALIASES = {"letter": "choice"}
NATIVE = "native"
# Speed features of JevAny's that the daemon does not have (yet): on in JevAny when set so.
UNOFFERED = {
    "JEVANY_FUSED_KERNELS": (lambda v: v == "1",
                             "JevAny's fused Qwen3.5 kernels are not available in jevany-daemon; unset it. Hybrid "
                             "models' linear-attention layers already run flash-linear-attention's kernels where it "
                             "is installed (see linear_attention in jevany-ctl models)"),
}


class OptionError(ValueError):
    """A JevAny option the daemon refuses; the message names it and what to use instead."""


def refuse_unoffered(env) -> None:
    """JevAny's variables for features the daemon lacks: refused when JevAny would turn them on."""
    for name, (on, why) in UNOFFERED.items():
        if on(env.get(name, "")):
            raise OptionError(f"{name}={env[name]}: {why}")


def readout(value: str | None) -> str | None:
    """JevAny's spelling of a readout, as the daemon names it."""
    return READOUT_ALIASES.get(value, value)


def http_from_host_port(host: str | None, port: int | None, http: str | None) -> str | None:
    """jevany serve's --host and --port (127.0.0.1 and 8008 by default there) as --http HOST:PORT."""
    if host is None and port is None:
        return http
    if http is not None:
        raise OptionError("give --http HOST:PORT, or JevAny's --host and --port, not both")
    host = host or "127.0.0.1"
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{host}:{8008 if port is None else port}"


def plain_model(model: str | None) -> bool:
    """Whether model is known, without loading it, to be a plain causal LM (no head.pt): the demo, or a directory."""
    if model is None:
        return True
    path = Path(model).expanduser()
    return path.is_dir() and not (path / "head.pt").is_file()


def check_readout_rules(model: str | None, readout: str | None, temperature: float | None) -> None:
    """JevAny's rules: native needs a checkpoint's head; JEVANY_TEMPERATURE is the native head's, not choice's."""
    plain = plain_model(model)
    if readout == NATIVE and plain:
        raise OptionError(f"readout native reads a JevAny checkpoint's own head, and {model or 'the demo model'} "
                          "is a plain causal LM (no head.pt); give --readout choice")
    if temperature is not None and (readout == "choice" or (readout is None and plain)):
        raise OptionError("temperature applies to a checkpoint's native head, not to the choice readout (JevAny "
                          "refuses JEVANY_TEMPERATURE with it too); give --choice-temperature "
                          "(JEVANY_CHOICE_TEMPERATURE) instead")
