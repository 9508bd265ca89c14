"""The serve command's options, built from the settings' declarations (declaration.py).

Each setting becomes a typer option of its own name: its flag (--name-with-hyphens, then
JevAny's names for it), a --no- form for a switch, its help with its default stated, hidden
where the setting is. JevAny's legacy spelling of a setting becomes a hidden option of its own.
Beside them, three options that are no setting: JevAny's --host and --port (another way to give
--http) and --config. Every option defaults to None, "not given", so that resolve can tell a
flag from the environment and the TOML file beneath it. No torch.
"""
import inspect
from pathlib import Path

import typer

from jevany_daemon.declaration import GROUPS, Setting
from jevany_daemon.server import jevany_options
from jevany_daemon.server.settings import SETTINGS

# JevAny's --host and --port are listed after the service's settings, beside --http.
_HOST_PORT_AFTER = "service"
_HOST = typer.Option(None, "--host", help="JevAny's --host: with --port, the same as --http HOST:PORT. "
                     "[default: 127.0.0.1 when --port is given]", show_default=False)
_PORT = typer.Option(None, "--port", help="JevAny's --port: with --host, the same as --http HOST:PORT. "
                     "[default: 8008 when --host is given]", show_default=False)
_CONFIG = typer.Option(None, "--config", help="TOML file of the same settings (snake_case keys). "
                       "[default: none]", show_default=False)


class FlagError(ValueError):
    """Flags that cannot be read as settings; the message names the flag."""


def _annotation(s: Setting):
    """The type typer reads a setting's flag as: text where the setting parses its own (a file mode)."""
    if s.parse is not None:
        return str
    return list[str] if s.kind is tuple else s.kind


def _option(s: Setting) -> inspect.Parameter:
    names = [f"{s.cli_flag}/{s.off_flag}"] if s.off_flag else [s.cli_flag, *s.jevany_flags]
    option = typer.Option(None, *names, help=f"{s.help} [default: {s.default_text}]", show_default=False,
                          hidden=s.hidden, metavar=s.metavar)
    return _keyword(s.name, option, _annotation(s))


def _legacy_name(s: Setting) -> str:
    return s.legacy_flag.removeprefix("--").replace("-", "_")


def _legacy_option(s: Setting) -> inspect.Parameter:
    return _keyword(_legacy_name(s), typer.Option(None, s.legacy_flag, hidden=True), _annotation(s))


def _keyword(name: str, option, annotation) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def _parameters() -> list[inspect.Parameter]:
    """Every option, in GROUPS' order: a setting's legacy spelling after it, --config last."""
    parameters = []
    for group in GROUPS:
        for s in SETTINGS:
            if s.group == group and s.flag:
                parameters.append(_option(s))
                parameters += [_legacy_option(s)] if s.legacy_flag else []
        if group == _HOST_PORT_AFTER:
            parameters += [_keyword("host", _HOST, str), _keyword("port", _PORT, int)]
    return parameters + [_keyword("config", _CONFIG, Path)]


def with_setting_options(command):
    """command(**given) as typer sees it: one keyword parameter per option, typed and documented."""
    parameters = _parameters()
    command.__signature__ = inspect.Signature(parameters, return_annotation=None)
    command.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return command


def flags(given: dict) -> dict:
    """The settings the command line gives, by name (None: not given), from the options' values."""
    found = {}
    for s in SETTINGS:
        if s.flag:
            value = _from_legacy(s, given[s.name], given[_legacy_name(s)]) if s.legacy_flag else given[s.name]
            found[s.name] = _value(s, value)
    try:
        found["http"] = jevany_options.http_from_host_port(given["host"], given["port"], found["http"])
    except jevany_options.OptionError as exc:
        raise FlagError(str(exc)) from None
    return found


def _from_legacy(s: Setting, value, legacy_value):
    """JevAny's legacy spellings of the choice readout's options ("letter") still work, one at a time."""
    if value is not None and legacy_value is not None:
        raise FlagError(f"give at most one of {s.cli_flag} and its legacy spelling {s.legacy_flag}")
    return value if legacy_value is None else legacy_value


def _value(s: Setting, value):
    if s.kind is tuple:
        return tuple(value or ())
    if s.parse is not None and value is not None:
        try:
            return s.parse(value)
        except ValueError as exc:
            raise FlagError(f"{s.cli_flag}: {value!r} is not {exc}") from None
    return value
