"""How a daemon setting is declared: once, on its dataclass field.

A setting's name, type and default are its field's; the field's metadata (a Setting) holds the
rest: its help text, how its default is stated, its flags, which sources may set it (a flag, its
JEVANY_* variable, the TOML file), whether a reload takes it, and its rule where the rule is
simple. The serve command's options (serve_options.py), reading the environment and the TOML
file (server/settings.py), the simple half of validation and the settings table in
docs/SERVING.md (settings_table.py) are derived from these declarations, so a new setting is
written in one place. No torch: the supervisor reads them.
"""
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

# Where --help and the docs list a setting: the model and how it loads, the shape plan, the
# sockets, batching, the service around them, the choice readout, benchmarks' own, media.
GROUPS = ("model", "load", "plan", "sockets", "batching", "service", "choice", "benchmarks", "media")
_METADATA_KEY = "jevany_setting"
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


@dataclass(frozen=True)
class Rule:
    """A check one value must pass, else ValueError "<name> <must>, got <value>[: <why>]"."""
    test: Callable[[Any], bool]
    must: str
    why: str = ""

    def check(self, name: str, value) -> None:
        if not self.test(value):
            raise ValueError(f"{name} {self.must}, got {value!r}" + (f": {self.why}" if self.why else ""))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(least: int, most: int | None = None, must: str | None = None) -> Rule:
    return Rule(lambda v: _is_int(v) and v >= least and (most is None or v <= most),
                must or f"must be an integer >= {least}")


def number(unit: str | None = None, *, finite: bool = True, must: str | None = None) -> Rule:
    """A number > 0: "of seconds", "of ms"...; finite=False lets infinity through (never time out)."""
    return Rule(lambda v: _is_number(v) and v > 0 and (math.isfinite(v) or not finite),
                must or (f"must be a number of {unit} > 0" if unit else "must be a finite number > 0"))


def fraction(must: str = "must be a number from 0 to 1") -> Rule:
    return Rule(lambda v: _is_number(v) and 0 <= v <= 1, must)


def finite(must: str = "must be a finite number") -> Rule:
    return Rule(lambda v: _is_number(v) and math.isfinite(v), must)


def one_of(choices, must: str | None = None, why: str = "") -> Rule:
    return Rule(lambda v: v in choices, must or f"must be one of {', '.join(choices)}", why)


BOOLEAN = Rule(lambda v: isinstance(v, bool), "must be true or false")


@dataclass(frozen=True)
class Setting:
    """One setting, as its field's metadata declares it; declared() fills in name, type and default."""
    help: str                          # --help's text and the docs' meaning; plain text, whole sentences
    group: str                         # one of GROUPS
    shown_default: str | None = None   # the default in words, where the value alone would not say it
    rule: Rule | None = None           # a bool's is BOOLEAN unless given
    reload: bool = False               # a reload takes a new value; otherwise it needs a restart
    flag: bool = True                  # may come from a flag, --NAME-WITH-HYPHENS
    env: bool = True                   # ... from JEVANY_NAME
    toml: bool = True                  # ... from the --config file
    jevany_flags: tuple[str, ...] = ()     # JevAny's names for the same flag
    legacy_flag: str | None = None     # JevAny's legacy spelling: a hidden flag, refused beside the flag
    metavar: str | None = None
    hidden: bool = False               # benchmarks' and tests' own: not in --help
    # Text (a variable's or a flag's) → value, where the type does not say how; its ValueError's
    # message says what it expects ("a file mode such as 0660").
    parse: Callable[[str], Any] | None = None
    from_toml: Callable[[Any], Any] | None = None    # a TOML value → the setting's, where TOML's types differ
    normalise: Callable[[Any], Any] | None = None    # JevAny's spellings, from whichever source wins
    more: str = ""                     # the docs' table only: Markdown after the help (a link, what
                                       # --help has no room for)
    name: str = ""
    type: Any = None
    default: Any = None

    @property
    def cli_flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def off_flag(self) -> str | None:
        """A switch's other half, --no-NAME; None for a setting that takes a value."""
        return "--no-" + self.cli_flag[2:] if self.kind is bool else None

    @property
    def variable(self) -> str | None:
        return f"JEVANY_{self.name.upper()}" if self.env else None

    @property
    def kind(self) -> type:
        """The value's type, None aside: int for `int | None`, tuple for `tuple[str, ...]`."""
        t = self.type
        if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
            t = next(a for a in typing.get_args(t) if a is not type(None))
        return typing.get_origin(t) or t

    @property
    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    def from_text(self, raw: str):
        """A flag's or variable's text as this setting's value; ValueError says what was expected."""
        if self.parse is not None:
            return self.parse(raw)
        try:
            if self.kind is bool:
                if raw.lower() not in _TRUE + _FALSE:
                    raise ValueError(raw)
                return raw.lower() in _TRUE
            if self.kind is tuple:      # a list: comma-separated
                return tuple(part.strip() for part in raw.split(",") if part.strip())
            return self.kind(raw)
        except ValueError:
            raise ValueError(f"a valid {self.name}") from None

    def check(self, value) -> None:
        """The setting's rule, on a value other than an unset optional one."""
        if value is None and self.default is None:
            return
        rule = self.rule or (BOOLEAN if self.kind is bool else None)
        if rule is not None:
            rule.check(self.name, value)


def setting(default, help: str, *, group: str, **declared) -> Any:
    """A dataclass field declaring a setting a restart takes; see Setting for what else it may say."""
    if group not in GROUPS:
        raise ValueError(f"setting group {group!r} is none of {GROUPS}")
    if default is None and declared.get("shown_default") is None:
        raise ValueError(f"a setting whose default is None says what that means (shown_default): {help!r}")
    return field(default=default, metadata={_METADATA_KEY: Setting(help, group, **declared)})


def reloadable(default, help: str, *, group: str, **declared) -> Any:
    """A dataclass field declaring a setting a reload takes without a restart."""
    return setting(default, help, group=group, reload=True, **declared)


@functools.cache
def declared(cls) -> tuple[Setting, ...]:
    """The settings a dataclass declares, in field order, each with its name, type and default."""
    return tuple(replace(f.metadata[_METADATA_KEY], name=f.name, type=f.type, default=f.default)
                 for f in fields(cls) if _METADATA_KEY in f.metadata)


def check(instance, error: type[Exception] = ValueError) -> None:
    """Every declared setting of a dataclass instance against its rule."""
    for s in declared(type(instance)):
        try:
            s.check(getattr(instance, s.name))
        except ValueError as exc:
            raise error(str(exc)) from None


def read_environment(settings, env: Mapping[str, str], error: type[Exception] = ValueError) -> dict:
    """The settings' JEVANY_* variables that are set (empty is unset), parsed; error names the variable."""
    found = {}
    for s in settings:
        raw = env.get(s.variable) if s.env else None
        if raw is None or raw == "":
            continue
        try:
            found[s.name] = s.from_text(raw)
        except ValueError as exc:
            raise error(f"{s.variable}: {raw!r} is not {exc}") from None
    return found
