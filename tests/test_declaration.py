"""Settings declared once, on their fields: the rules' messages, and what every declaration must say."""
from dataclasses import dataclass

import pytest

from jevany_daemon.config import EngineConfig, LoadOptions
from jevany_daemon.declaration import (BOOLEAN, GROUPS, declared, fraction, integer, number, one_of,
                                       read_environment, setting)
from jevany_daemon.server.settings import RELOADABLE, SETTINGS, ServeSettings


@pytest.mark.parametrize("rule,value,message", [
    (integer(1), 0, "x must be an integer >= 1, got 0"),
    (integer(1), True, "x must be an integer >= 1, got True"),          # a bool is no count
    (integer(0, 9, "must be a digit"), 10, "x must be a digit, got 10"),
    (number("seconds"), float("inf"), "x must be a number of seconds > 0, got inf"),
    (number(), "2", "x must be a finite number > 0, got '2'"),
    (fraction(), 1.5, "x must be a number from 0 to 1, got 1.5"),
    (one_of(("a", "b")), "c", "x must be one of a, b, got 'c'"),
    (one_of(("a",), "must be a", why="b is not served"), "b", "x must be a, got 'b': b is not served"),
    (BOOLEAN, "yes", "x must be true or false, got 'yes'"),
])
def test_a_rule_names_the_setting_what_it_must_be_and_the_value(rule, value, message):
    with pytest.raises(ValueError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        rule.check("x", value)


def test_rules_pass_what_they_allow():
    for rule, value in ((integer(1), 1), (number("seconds", finite=False), float("inf")), (fraction(), 0),
                        (one_of(("a",)), "a"), (BOOLEAN, False)):
        rule.check("x", value)


def test_an_unset_optional_setting_skips_its_rule_and_a_bool_needs_no_rule_named():
    @dataclass(frozen=True)
    class Declared:
        limit: int | None = setting(None, "A limit.", group="service", shown_default="none", rule=integer(1))
        on: bool = setting(False, "A switch.", group="service")

    limit, on = declared(Declared)
    limit.check(None)
    with pytest.raises(ValueError, match="limit must be an integer >= 1, got 0"):
        limit.check(0)
    with pytest.raises(ValueError, match="on must be true or false, got 1"):
        on.check(1)


def test_a_setting_says_what_an_unset_default_means_and_names_a_known_group():
    with pytest.raises(ValueError, match="says what that means"):
        setting(None, "Something.", group="service")
    with pytest.raises(ValueError, match="group 'elsewhere'"):
        setting(1, "Something.", group="elsewhere")


def test_every_setting_is_declared_whole():
    assert len(SETTINGS) == len(declared(ServeSettings)) + len(declared(EngineConfig)) + len(declared(LoadOptions))
    for s in SETTINGS:
        assert s.help.endswith(".") and s.group in GROUPS, s.name
        assert s.default_text and "[" not in s.help, s.name       # the default is stated once, by the option
    groups = [GROUPS.index(s.group) for s in SETTINGS]
    assert groups == sorted(groups)                                 # --help and the docs list them by group


def test_the_engine_and_load_options_are_reloaded_whole_so_each_of_theirs_is_reloadable():
    assert {"engine", "load"} <= set(RELOADABLE)
    for s in declared(EngineConfig) + declared(LoadOptions):
        assert s.reload, s.name
    assert [s.name for s in declared(ServeSettings) if s.reload] == [n for n in RELOADABLE if n in
                                                                       {s.name for s in declared(ServeSettings)}]


def test_every_flag_and_variable_names_one_setting():
    flags = [f for s in SETTINGS for f in (s.cli_flag, *s.jevany_flags, *([s.legacy_flag] if s.legacy_flag else []))]
    flags += ["--host", "--port", "--config"]
    assert len(flags) == len(set(flags))
    variables = [s.variable for s in SETTINGS if s.env]
    assert len(variables) == len(set(variables))


SAMPLES = {int: ("3", 3), float: ("0.5", 0.5), str: ("x", "x"), bool: ("yes", True), tuple: ("a, b", ("a", "b"))}


def sample(s):
    """A text for the setting and the value it reads as."""
    return ("0660", 0o660) if s.name == "socket_mode" else SAMPLES[s.kind]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_every_variable_reaches_its_setting(s):
    text, value = sample(s)
    assert read_environment(SETTINGS, {s.variable: text}) == {s.name: value}
    if s.kind not in (str, tuple):
        with pytest.raises(ValueError, match=f"^{s.variable}: 'junk' is not "):
            read_environment(SETTINGS, {s.variable: "junk"})


def test_an_empty_variable_is_unset_not_a_value():
    # `JEVANY_X=` in a unit's Environment= or an env file is how one clears a setting: it must leave the
    # default (the flag's, the config file's) in place, not refuse the daemon or set a str setting to "".
    empty = {s.variable: "" for s in SETTINGS if s.env}
    assert read_environment(SETTINGS, empty) == {}
    s = next(s for s in SETTINGS if s.env and s.kind is int)
    text, value = sample(s)
    assert read_environment(SETTINGS, {**empty, s.variable: text}) == {s.name: value}
