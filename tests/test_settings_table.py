"""The settings table in docs/SERVING.md is the one the settings' declarations write, row for row.

A setting added to a dataclass without the page written afresh (python -m
jevany_daemon.settings_table) fails here, as does a hand edit of the table.
"""
import re

import pytest

from jevany_daemon import settings_table
from jevany_daemon.server.settings import SETTINGS

from .docs import DOCS, section


def test_the_docs_table_is_the_one_the_declarations_write():
    page = settings_table.PAGE.read_text(encoding="utf-8")
    assert settings_table.written(page) == page, \
        "docs/SERVING.md's settings table differs from the declarations: run python -m jevany_daemon.settings_table"


def test_every_setting_has_its_row_under_settings():
    text = section(DOCS / "SERVING.md", "Settings")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for s in SETTINGS:
        assert not s.env or sum(f"`{s.variable}`" in row for row in rows) == 1, s.name
        assert not s.flag or sum(bool(re.match(rf"\| `{s.cli_flag}[` ]", row)) for row in rows) == 1, s.name
    for name, _, _ in settings_table.OTHER_VARIABLES:
        assert any(f"`{name}`" in row for row in rows), name


def test_a_new_setting_shows_as_a_stale_table(monkeypatch):
    from dataclasses import dataclass

    from jevany_daemon.declaration import declared, setting

    @dataclass(frozen=True)
    class Added:
        shiny: int = setting(3, "A setting no page names yet.", group="service")

    page = settings_table.PAGE.read_text(encoding="utf-8")
    monkeypatch.setattr(settings_table, "SETTINGS", SETTINGS + declared(Added))
    fresh = settings_table.written(page)
    assert fresh != page and "| `--shiny` | `JEVANY_SHINY` | 3 |  | A setting no page names yet. |" in fresh


def test_the_markers_are_required_once():
    with pytest.raises(ValueError, match="needs one line"):
        settings_table.written("# A page\n\nno table here\n")


def test_check_says_whether_the_page_is_current(tmp_path):
    page = tmp_path / "SERVING.md"
    page.write_text(f"# Settings\n\n{settings_table.BEGIN}\n| stale |\n{settings_table.END}\n\nafter\n")
    assert settings_table.main([str(page), "--check"]) == 1
    assert settings_table.main([str(page)]) == 0
    assert settings_table.main([str(page), "--check"]) == 0
    assert page.read_text().endswith(f"{settings_table.END}\n\nafter\n")
