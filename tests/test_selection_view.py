"""The layers below ``selection.py`` read a Selection only through ``SelectionView``: a Selection
is one, and no module below reads a member the view does not declare."""
from __future__ import annotations

import ast

import pytest

from flagos_torchfl.selection import build_selection
from flagos_torchfl.selection_view import SelectionView
from tests.helpers import ROOT

SRC = ROOT / "src" / "flagos_torchfl"
#: the modules and packages at or above the decision, which may read all of a Selection
ABOVE = {"selection.py", "inherit.py", "api.py", "startup.py", "__init__.py", "__main__.py", "cli", "bootstrap"}
MEMBERS = {name for name in dir(SelectionView) if not name.startswith("_")} | set(SelectionView.__annotations__)


def reads(source: str) -> set:
    """``(line, member)`` for every ``selection.<member>`` in ``source``."""
    return {(node.lineno, node.attr) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "selection"}


def undeclared(source: str) -> list:
    return sorted((line, member) for line, member in reads(source) if member not in MEMBERS)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("sim", marks=pytest.mark.needs_sim)])
def test_a_selection_is_a_view(backend):
    assert isinstance(build_selection(backend, environ={}), SelectionView)


def test_the_layers_below_read_only_the_views_members():
    below = [p for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] not in ABOVE]
    assert len(below) > 50
    found = {str(p.relative_to(SRC)): undeclared(p.read_text(encoding="utf-8")) for p in below}
    assert {k: v for k, v in found.items() if v} == {}


def test_a_read_of_an_undeclared_member_is_found():
    """An injected read (``selection.reason``: a Selection has it, the view does not)."""
    assert undeclared("def f(selection):\n    return selection.devices, selection.reason\n") == [(2, "reason")]
