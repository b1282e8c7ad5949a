"""The package's modules import one another without a cycle: every import counts, the ones inside
functions too (moving an import into a function hides a cycle, it does not remove it). Read from
the sources (``ast``), so nothing is imported."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = "flagos_torchfl"
SOURCES = ROOT / "src"


def modules() -> dict:
    """Dotted module name -> source file, for every module of the package."""
    found = {}
    for path in sorted((SOURCES / PACKAGE).rglob("*.py")):
        parts = path.relative_to(SOURCES).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known: dict) -> set:
    """The package's modules that module ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name:
                found.add(target)
    return found


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_the_package_takes_part_in_an_import_cycle():
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert len(graph) > 100 and graph["flagos_torchfl.api"]  # the sources were read
    assert cycles(graph) == []


def test_the_check_finds_a_cycle_where_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    graph["flagos_torchfl.variables"].add("flagos_torchfl.api")  # variables asking the api
    assert any("flagos_torchfl.variables" in c and "flagos_torchfl.api" in c for c in cycles(graph))
