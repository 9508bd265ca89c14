"""The README and the pages under docs/: which pages there are, in what order, their sections and links.

The README is the front door; its "The docs" section maps the pages, and that map's order is the order
their examples run in (tests/test_readme.py). Tests that check what a page says read its section by
heading here, so a section that moves to another page is found by page and title, not by line.
"""
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAP_SECTION = "The docs"

HEADING = re.compile(r"(#{1,6}) +(.+?)\s*")
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"(`+).+?\1")


@dataclass
class Heading:
    line: int       # 1-based
    level: int
    title: str
    anchor: str


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code blanked out."""
    out, fenced = [], False
    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((number, INLINE_CODE.sub(lambda m: " " * len(m[0]), line)))
    return out


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)        # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def headings(path: Path) -> list[Heading]:
    lines, found, seen = path.read_text().split("\n"), [], {}
    for number, _ in prose(path.read_text()):
        match = HEADING.fullmatch(lines[number - 1])
        if match is None:
            continue
        base = slug(match[2])
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.append(Heading(number, len(match[1]), match[2], base if n == 0 else f"{base}-{n}"))
    return found


def section(path: Path, title: str) -> str:
    """The text under the one heading titled `title`, up to the next heading of its level or above."""
    lines, marks = path.read_text().split("\n"), headings(path)
    at = [h for h in marks if h.title == title]
    assert len(at) == 1, f"{path.relative_to(ROOT)}: {len(at)} headings titled {title!r}"
    end = next((h.line - 1 for h in marks if h.line > at[0].line and h.level <= at[0].level), len(lines))
    return "\n".join(lines[at[0].line:end])


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link outside code."""
    return [(number, m[1]) for number, line in prose(text) for m in LINK.finditer(line)]


def is_relative(target: str) -> bool:
    return re.match(r"[a-z][a-z0-9+.-]*:", target) is None


def pages() -> list[Path]:
    """The README, then the docs pages in the order the README's map first links them."""
    order = []
    for _, target in links(section(README, MAP_SECTION)):
        path = (ROOT / target.split("#", 1)[0]).resolve()
        if is_relative(target) and path.parent == DOCS and path not in order:
            order.append(path)
    return [README] + order
