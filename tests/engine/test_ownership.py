"""The engine's parts are handed what they use, never the engine; no module reads an engine's private attributes.

Read from the source (ast), so a part that is handed the engine again, or a
module that reaches into an engine's private attributes, fails here before
it couples anything else to them. engine.py composes the parts and is the
one module that may use its own private names.
"""
import ast
from pathlib import Path

import jevany_daemon

PACKAGE = Path(jevany_daemon.__file__).parent
# Parts the engine composes, by class and module: each is handed its parts or callables, not the engine.
PARTS = {"Passes": "engine/passes.py", "Admission": "engine/admission.py"}


def _is_engine(node: ast.AST) -> bool:
    """engine, self.engine (any .engine), or the Engine class."""
    if isinstance(node, ast.Name):
        return node.id in ("engine", "Engine")
    return isinstance(node, ast.Attribute) and node.attr == "engine"


def _trees(root: Path):
    for path in sorted(root.rglob("*.py")):
        yield path.relative_to(root).as_posix(), ast.parse(path.read_text(), str(path))


def private_reads(root: Path = PACKAGE) -> list[str]:
    """Every engine.<_private> outside engine.py, as "module:line name"."""
    found = []
    for name, tree in _trees(root):
        if name == "engine/engine.py":
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and _is_engine(node.value)):
                found.append(f"{name}:{node.lineno} {node.attr}")
    return found


def engines_handed(root: Path = PACKAGE) -> list[str]:
    """Each place a part is given the engine: a call of it with self or an engine among its arguments, or the
    part's own module holding one (a parameter or name engine, or an .engine attribute)."""
    found = []
    for name, tree in _trees(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PARTS:
                values = [*node.args, *(k.value for k in node.keywords)]
                if any(_is_engine(v) or (isinstance(v, ast.Name) and v.id == "self") for v in values):
                    found.append(f"{name}:{node.lineno} {node.func.id}(...) given the engine")
        if name in PARTS.values():
            for node in ast.walk(tree):
                if (isinstance(node, ast.arg) and node.arg == "engine") or _is_engine(node):
                    found.append(f"{name}:{node.lineno} holds an engine")
    return found


def test_no_module_reads_a_private_attribute_of_an_engine():
    assert private_reads() == []


def test_the_engines_parts_are_handed_their_parts_not_the_engine():
    assert engines_handed() == []


def test_the_checks_see_what_they_look_for(tmp_path):
    """The checks find the couplings they forbid, as they once were written."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "engine.py").write_text("class Engine:\n    def __init__(self):\n"
                                                   "        self.passes = Passes(self)\n")
    (tmp_path / "engine" / "passes.py").write_text("class Passes:\n    def __init__(self, engine):\n"
                                                   "        self.engine = engine\n\n"
                                                   "    def run(self):\n        return self.engine._backbone()\n")
    (tmp_path / "train.py").write_text("def gathered(engine):\n    return engine._backbone\n")
    assert private_reads(tmp_path) == ["engine/passes.py:6 _backbone", "train.py:2 _backbone"]
    assert "engine/engine.py:3 Passes(...) given the engine" in engines_handed(tmp_path)
    assert any(f.startswith("engine/passes.py:2 ") for f in engines_handed(tmp_path))
