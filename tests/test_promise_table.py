"""The promise table in tests/README.md names only tests that exist, and pages and headings that exist.

The table is how a gap shows at a glance; a renamed or deleted test must not
leave a row that still looks guarded, and a section that moved or was renamed
must not leave a row pointing at nothing. The README's sections now live on
pages under docs/; each row of their table leads with a link to the page and
heading that makes its promise.
"""
import ast
import re
from pathlib import Path

from tests.docs import ROOT, headings

TESTS = Path(__file__).parent
NAMED = re.compile(r"`([\w/]+\.py)::(\w+)")
PAGES_TABLE = "### README.md and its pages under docs/"
SECTION = re.compile(r"\[(?P<page>[\w.-]+): (?P<title>[^\]]+)\]\((?P<target>[^)#]+)#(?P<anchor>[^)]+)\)( \(.+\))?")


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_test_the_promise_table_names_exists():
    table = (TESTS / "README.md").read_text()
    named = NAMED.findall(table)
    assert len(named) > 100          # the table is there, and this pattern still reads it
    missing = [f"{file}::{name}" for file, name in named
               if not (TESTS / file).is_file() or name not in defined_tests(TESTS / file)]
    assert not missing, f"tests/README.md names tests that do not exist: {missing}"


def test_every_row_names_the_page_and_heading_of_its_promise():
    text = (TESTS / "README.md").read_text()
    assert text.count(PAGES_TABLE) == 1
    table = text.split(PAGES_TABLE, 1)[1].split("\n#", 1)[0]
    rows = [line for line in table.split("\n")
            if line.startswith("| ") and not line.startswith(("| section ", "|---"))]
    assert len(rows) > 150           # the table is there, and this reads its rows
    wrong = []
    for row in rows:
        cell = row[2:].split(" | ", 1)[0]
        if cell == "(this file)":
            continue
        match = SECTION.fullmatch(cell)
        page = (TESTS / match["target"]).resolve() if match else None
        if page is None or not page.is_file() or page.name != match["page"]:
            wrong.append(f"{cell}: not a link to a page named as it is")
            continue
        titles = {h.anchor: h.title for h in headings(page)}
        if titles.get(match["anchor"]) != match["title"]:
            wrong.append(f"{cell}: {page.relative_to(ROOT)} has no heading {match['title']!r} at that anchor")
    assert wrong == [], "\n".join(wrong)
