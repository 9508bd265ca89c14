"""Every command's --help has one look: plain text at 80 columns, defaults and variables shown.

Each screen runs in a subprocess, as a console script runs it (the entry points are read from
the two pyproject.toml files), with COLUMNS unset and with a wide terminal: typer's boxed
panels would show as box-drawing characters, and grow or cut with the terminal.
"""
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The screens of each command: its own, and each subcommand's.
SCREENS = {
    "jevany-daemon": [[], ["serve"], ["tiny-model"], ["keygen"]],
    "jevany-client": [[], ["decide"]],
    "jevany-ctl": [[], ["status"], ["ping"], ["models"], ["clear-cache"], ["drain"], ["reload"]],
    "jevany-eval": [[], ["merge"]],
}
# Variables a screen must name for its options, as serve's [env: ...] does.
VARIABLES = {
    ("jevany-daemon", "serve"): ["JEVANY_MAX_BATCH_SIZE", "JEVANY_MODEL", "JEVANY_MEDIA_ROOT"],
    ("jevany-client", "decide"): ["JEVANY_ENDPOINT"],
    ("jevany-eval", ""): ["JEVANY_ENDPOINT"],
    **{("jevany-ctl", op): ["JEVANY_ENDPOINT"] for op in ("status", "ping", "models")},
    **{("jevany-ctl", op): ["JEVANY_CONTROL_ENDPOINT"] for op in ("clear-cache", "drain", "reload")},
}
OPTION = re.compile(r"^  (-\w, )?--\S")


def entry_points() -> dict:
    scripts = {}
    for pyproject in (ROOT / "pyproject.toml", ROOT / "client" / "pyproject.toml"):
        scripts.update(tomllib.loads(pyproject.read_text())["project"]["scripts"])
    return scripts


def help_screen(script: str, target: str, args: list, columns: str | None) -> str:
    module, name = target.split(":")
    code = f"import sys; sys.argv[0] = {script!r}; from {module} import {name}; sys.exit({name}())"
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    proc = subprocess.run([sys.executable, "-c", code, *args, "--help"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def section(text: str, title: str) -> list[str]:
    """The lines of a section ("Options:", "Commands:") up to the blank line that ends it."""
    lines = text.splitlines()
    if f"{title}:" not in lines:
        return []
    rest = lines[lines.index(f"{title}:") + 1:]
    return rest[:rest.index("")] if "" in rest else rest


def options(text: str) -> dict[str, str]:
    """Each option's entry, its lines joined: {"--timeout": "--timeout <float range> Seconds ..."}."""
    entries: list[list[str]] = []
    for line in section(text, "Options"):
        if OPTION.match(line):
            entries.append([line])
        elif entries:
            entries[-1].append(line)
    joined = (" ".join(" ".join(entry).split()) for entry in entries)
    return {re.search(r"--[\w-]+", entry)[0]: entry for entry in joined}


def test_the_four_commands_are_the_entry_points():
    assert set(entry_points()) == set(SCREENS)


@pytest.mark.parametrize("columns", [None, "200"], ids=["columns-unset", "columns-200"])
@pytest.mark.parametrize("script", sorted(SCREENS))
def test_every_help_screen_is_plain_80_columns_with_defaults(script, columns):
    target = entry_points()[script]
    for args in SCREENS[script]:
        where = " ".join([script, *args])
        text = help_screen(script, target, args, columns)
        assert text.startswith("Usage: "), where
        boxes = sorted({c for c in text if "\u2500" <= c <= "\u259f"})    # box drawing and block elements
        assert not boxes, f"{where}: {boxes}"
        widest = max(text.splitlines(), key=len)
        assert len(widest) <= 80, f"{where}: {len(widest)} columns: {widest!r}"
        if not args:     # every subcommand the screen lists has a screen here
            listed = {line.split()[0] for line in section(text, "Commands")}
            assert listed <= {a[0] for a in SCREENS[script] if a}, where
        for name, entry in options(text).items():
            if name != "--help":
                assert "[default:" in entry or "[required]" in entry, f"{where}: {entry}"
        flat = " ".join(text.split())
        for variable in VARIABLES.get((script, " ".join(args)), []):
            assert f"[env: {variable}]" in flat, f"{where}: {variable}"
