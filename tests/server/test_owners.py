"""The supervisor's helpers are handed the parts they use, never the supervisor itself.

A helper handed its owner can read and write whatever the owner holds, and no
one can tell from its constructor what it depends on. Read from the source:
the supervisor passes no helper `self`, and no module of the daemon names a
parameter or an attribute for the supervisor.
"""
import ast
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parents[2] / "jevany_daemon" / "server"
OWNER_NAMES = {"sup", "supervisor"}


def _self_passed(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        values = list(node.args) + [k.value for k in node.keywords]
        values += [v.value for v in values if isinstance(v, ast.Starred)]
        if any(isinstance(v, ast.Name) and v.id == "self" for v in values):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _owner_names(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p is not None]
            found += [f"line {node.lineno}: parameter {p.arg}" for p in params if p.arg in OWNER_NAMES]
        elif isinstance(node, ast.Attribute) and node.attr in OWNER_NAMES:
            found.append(f"line {node.lineno}: attribute {ast.unparse(node)}")
    return found


def test_the_supervisor_hands_no_helper_itself():
    passed = _self_passed(ast.parse((SERVER / "supervisor.py").read_text()))
    assert not passed, "the supervisor hands a helper itself; hand it the parts it uses:\n" + "\n".join(passed)


@pytest.mark.parametrize("module", sorted(p.name for p in SERVER.glob("*.py")))
def test_no_helper_keeps_the_supervisor(module):
    named = _owner_names(ast.parse((SERVER / module).read_text()))
    assert not named, f"{module} names the supervisor; take the parts it uses instead:\n" + "\n".join(named)


def test_the_checks_see_what_they_look_for():
    # Guards the guards: each check finds the shape it exists to refuse.
    assert _self_passed(ast.parse("ClientOps(self)\nReloads(owner=self)\nf(*self)")) == [
        "line 1: ClientOps(self)", "line 2: Reloads(owner=self)", "line 3: f(*self)"]
    assert not _self_passed(ast.parse("Replies(clock=self.clock)\nf(lambda: self.settings)"))
    assert len(_owner_names(ast.parse("def f(sup): pass\nclass A:\n def __init__(self, *, supervisor): "
                                      "self.sup = supervisor\ng = lambda sup: sup"))) == 4
