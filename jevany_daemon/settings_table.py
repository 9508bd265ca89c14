"""The settings table of docs/SERVING.md, written from the settings' declarations.

One row per setting, in --help's order, then the variables that are no setting of serve
(OTHER_VARIABLES). `python -m jevany_daemon.settings_table` rewrites the table in place,
between its two marker comments; `--check` only says whether it would change anything, and
tests/test_settings_table.py fails while the page and the declarations differ. No torch.
"""
import argparse
import sys
from pathlib import Path

from jevany_daemon.declaration import Setting
from jevany_daemon.server.settings import SETTINGS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "SERVING.md"
BEGIN = "<!-- settings table: written from the settings' declarations by python -m jevany_daemon.settings_table -->"
END = "<!-- end of the settings table -->"
HEADER = ("| flag | variable | default | reload | meaning |", "|---|---|---|---|---|")

# Variables the daemon or its clients read that are no setting of serve: no flag, no TOML key.
# (variable, default, meaning in Markdown)
OTHER_VARIABLES = (
    ("JEVANY_LOG_LEVEL", "`INFO`", "log level: `DEBUG`, `INFO`, `WARNING` or `ERROR`; logs are one "
     "`event=... key=value` line each, on stderr"),
    ("JEVANY_CACHE_DIR", "`~/.cache/jevany`", "where the demo model is built, and compiled kernels kept "
     "(`inductor/`, with `--compile`; or `TORCHINDUCTOR_CACHE_DIR`), a directory no other user may write to"),
    ("JEVANY_ENDPOINT", "ipc in runtime dir", "the public endpoint clients connect to, and the daemon binds "
     "without `--bind`"),
    ("JEVANY_CONTROL_ENDPOINT", "ipc in runtime dir", "the control endpoint `jevany-ctl` connects to, and the "
     "daemon binds without `--control`"),
)


def _cell(text: str) -> str:
    """Plain text in a table cell: its pipes and asterisks kept as text."""
    return text.replace("|", "\\|").replace("*", "\\*")


def _flags(s: Setting) -> str:
    if not s.flag:
        return ""
    main = f"`{s.cli_flag}`, `{s.off_flag}`" if s.off_flag else f"`{s.cli_flag}`"
    if s.metavar:
        main = f"`{s.cli_flag} {s.metavar}`"
    notes = [f"JevAny's {', '.join(f'`{f}`' for f in s.jevany_flags)}"] if s.jevany_flags else []
    notes += [f"legacy `{s.legacy_flag}`"] if s.legacy_flag else []
    notes += ["repeatable"] if s.kind is tuple else []
    notes += ["hidden"] if s.hidden else []
    return main + (f" ({'; '.join(notes)})" if notes else "")


def _variable(s: Setting) -> str:
    if not s.env:
        return ""
    return f"`{s.variable}`" + (" (comma-separated)" if s.kind is tuple else "")


def _default(s: Setting) -> str:
    if s.shown_default is None and isinstance(s.default, str):
        return f"`{s.default}`"          # a value to type, not words
    return _cell(s.default_text)


def _meaning(s: Setting) -> str:
    parts = [_cell(s.help)]
    parts += ["Not in the TOML file."] if not s.toml else []
    parts += [s.more] if s.more else []
    return " ".join(parts)


def table() -> str:
    rows = [f"| {_flags(s)} | {_variable(s)} | {_default(s)} | {'yes' if s.reload else ''} | {_meaning(s)} |"
            for s in SETTINGS]
    rows += [f"| | `{name}` | {default} | | {meaning} |" for name, default, meaning in OTHER_VARIABLES]
    return "\n".join([*HEADER, *rows])


def written(page: str) -> str:
    """The page with the table between its markers written afresh."""
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise ValueError(f"the page needs one line {BEGIN!r} and one line {END!r} around the table")
    head, rest = page.split(BEGIN)
    tail = rest.split(END)[1]
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the settings table of docs/SERVING.md from the "
                                     "settings' declarations.")
    parser.add_argument("page", nargs="?", type=Path, default=PAGE, help=f"the page [default: {PAGE}]")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the table is stale")
    args = parser.parse_args(argv)
    text = args.page.read_text(encoding="utf-8")
    fresh = written(text)
    if args.check:
        print(f"{args.page}: the settings table is {'current' if fresh == text else 'stale'}")
        return 0 if fresh == text else 1
    args.page.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
