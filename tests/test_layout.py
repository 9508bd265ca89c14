"""Folders follow processes, and the indexes that name their modules stay true.

docs/LAYOUT.md and each package's __init__.py name every module the package
holds (and __init__.py no module it does not); the benchmarks and scripts
are named in LAYOUT.md too. Imports run one way: what every process shares
(jevany_daemon's own modules, engine/, model/, media/, starter/) imports no
process's folder, and no process's folder (server/, worker/, gateway/)
imports another's. The doors a user comes in by (the commands, and the
model in this process: inprocess.py, asgi.py) sit above them all.
"""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "LAYOUT.md"
PACKAGES = sorted(p.parent for top in ("jevany_daemon", "client/jevany_client") for p in (ROOT / top).rglob("__init__.py"))
ENTRY = re.compile(r"^ *(\w+\.py)\b", re.M)        # an index line: the module's name first
NAMED = re.compile(r"\b(\w+\.py)\b")
PROCESSES = ("server", "worker", "gateway")        # a process's own folder
DOORS = {"cli.py", "serve_options.py", "settings_table.py", "inprocess.py", "asgi.py", "__main__.py"}


def modules(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}


def layout_block(folder: str) -> str:
    """LAYOUT.md's lines for one folder: its own line and the indented lines under it."""
    block = []
    for line in LAYOUT.read_text().split("\n"):
        if block and line[:1] not in (" ", ""):
            break
        if line.startswith(folder + " ") or block:
            block.append(line)
    return "\n".join(block)


def ids(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("package", PACKAGES, ids=ids)
def test_the_package_index_names_every_module_and_no_other(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert set(ENTRY.findall(doc)) == modules(package)


@pytest.mark.parametrize("folder", PACKAGES + [ROOT / "benchmarks", ROOT / "scripts"], ids=ids)
def test_layout_md_names_every_module_of_the_folder(folder):
    block = layout_block(f"{folder.relative_to(ROOT)}/")
    assert block, f"docs/LAYOUT.md has no line for {folder.relative_to(ROOT)}/"
    found = folder.rglob("*.py") if folder.name == "benchmarks" else folder.glob("*.py")     # a package: its own
    files = {p.name for p in found if "__pycache__" not in p.parts} - {"__init__.py", "__main__.py"}
    if folder.name == "scripts":
        files |= {p.name for p in folder.iterdir() if p.is_file()}
    assert files <= set(NAMED.findall(block) + re.findall(r"\b([\w-]+)\b", block))


def imported(source: str, path: Path) -> set[str]:
    """The jevany_daemon modules the source of path imports, as dotted names; relative imports resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names |= {f"{base}.{a.name}" for a in node.names} | {base}
    return {n for n in names if n.startswith("jevany_daemon")}


def wing(dotted: str) -> str | None:
    """The process folder a module belongs to, or None for what every process shares."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PROCESSES else None


SOURCES = sorted(p for p in (ROOT / "jevany_daemon").rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", SOURCES, ids=ids)
def test_imports_run_from_the_processes_down_to_what_they_share(path):
    if path.parent.name == "jevany_daemon" and path.name in DOORS:
        return
    here = wing(".".join(path.relative_to(ROOT).with_suffix("").parts))
    crossing = sorted(n for n in imported(path.read_text(), path) if wing(n) not in (None, here))
    assert not crossing, f"{ids(path)} imports {crossing}"


def test_the_import_check_resolves_relative_imports_and_tells_the_wings_apart():
    shared = ROOT / "jevany_daemon" / "model" / "loading.py"
    source = "from ..server.logs import event\nfrom jevany_daemon.worker import loop\nfrom . import tiny\n"
    names = imported(source, shared)
    assert {"jevany_daemon.server.logs", "jevany_daemon.worker.loop", "jevany_daemon.model.tiny"} <= names
    assert {wing(n) for n in names} == {None, "server", "worker"}
    assert wing("jevany_daemon.logs") is None and wing("jevany_daemon.worker.loop") == "worker"
