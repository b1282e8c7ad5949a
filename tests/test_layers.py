"""The layout is the architecture: imports point down, and only backends know chips."""
from __future__ import annotations

import ast
import re

import pytest

from tests.helpers import ROOT

SRC = ROOT / "src" / "flagos_torchfl"
#: package -> the packages of flagos_torchfl it may import (besides errors, log, variables, config, compat, data_files, selection_view, patching,
#: registrations, threads, autoload, atomic_file, inline, optimizer_steps)
ALLOWED = {
    "aten": set(),
    "sim": {"aten"},
    "machine": {"sim"},
    "tables": {"aten", "sim"},
    "backends": {"aten", "sim", "entry_points", "machine", "tables"},
    "routing": {"aten", "backends", "entry_points", "tables"},
    "redirect": {"backends", "machine", "tables"},
    "k8s": {"backends"},
    "surface": {"backends", "sim", "machine"},
}
BASE = {"errors", "log", "variables", "config", "compat", "autoload", "atomic_file", "inline", "optimizer_steps",
        "registrations", "threads",
        "data_files", "selection_view", "patching"}


def imported_modules(path):
    """Every flagos_torchfl module ``path`` imports (relative or absolute), as a dotted name
    under flagos_torchfl (``sim.runtime.state``; ``sim.runtime`` for ``from ..runtime import x``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = list(path.relative_to(SRC).with_suffix("").parts)
    package = here if here[-1] == "__init__" else here
    package = package[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                if node.module:
                    found.add(".".join(base + node.module.split(".")))
                else:
                    found.update(".".join(base + [a.name]) for a in node.names)
            elif node.module and node.module.startswith("flagos_torchfl."):
                found.add(node.module.split(".", 1)[1])
    return {name for name in found if name}


def imported_packages(path):
    """The first component of every flagos_torchfl module ``path`` imports, its own package's
    aside."""
    package = path.relative_to(SRC).parts[0]
    return {name.split(".")[0] for name in imported_modules(path)} - {package}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_down(package):
    for path in (SRC / package).rglob("*.py"):
        extra = imported_packages(path) - ALLOWED[package] - BASE
        assert not extra, f"{path.relative_to(SRC)} imports {sorted(extra)}"


#: the sim's own parts, lowest first: its runtime knows nothing of its operators, and neither knows
#: how they are registered with torch
SIM_PARTS = ("runtime", "operators", "integration")


@pytest.mark.parametrize("part", SIM_PARTS)
def test_the_sims_parts_import_only_lower_ones(part):
    higher = SIM_PARTS[SIM_PARTS.index(part) + 1:]
    for path in (SRC / "sim" / part).rglob("*.py"):
        upward = {name for name in imported_modules(path)
                  if name.startswith("sim.") and name.split(".")[1] in higher}
        assert not upward, f"{path.relative_to(SRC)} imports {sorted(upward)}"


#: every module and package of flagos_torchfl, by layer, lowest first: each may import the base
#: modules and what lies in a lower layer, nothing beside or above it (docs/design.md, "Layers")
LAYERS = (
    ("base", {"errors", "autoload", "compat", "entry_points", "inline", "optimizer_steps", "version", "data_files", "selection_view", "patching",
              "registrations", "threads",
              "active", "config", "log", "variables", "atomic_file", "checkpoint_files"}),
    ("operators", {"aten"}),
    ("simulated device", {"sim"}),
    ("what chips need of the machine, the vendors' tables", {"machine", "tables"}),
    ("chips", {"backends"}),
    ("layers over the chips", {"redirect", "routing", "k8s", "surface"}),
    ("settings applied at activation", {"precision", "memory", "checkpoint"}),
    ("the decision", {"selection"}),
    ("children", {"inherit"}),
    ("the api", {"api"}),
    ("activation of launched processes", {"startup"}),
    ("entry points", {"__init__", "cli"}),
    ("entry points' own entry points", {"__main__", "bootstrap"}),
)


def _units() -> dict:
    """Each top-level module or package of flagos_torchfl -> the ones it imports."""
    from tests.test_import_graph import imported, modules

    known = modules()

    def unit(name):
        return name.split(".")[1] if "." in name else "__init__"

    found: dict = {}
    for name, path in known.items():
        targets = found.setdefault(unit(name), set())
        targets.update(unit(t) for t in imported(name, path, known) if t.startswith("flagos_torchfl"))
    return {u: targets - {u} for u, targets in found.items()}


def test_every_module_has_a_layer_and_imports_only_below_it():
    rank = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}
    units = _units()
    assert not set(units) - set(rank), f"not placed in LAYERS: {sorted(set(units) - set(rank))}"
    base = LAYERS[0][1]
    for unit, targets in units.items():
        if unit in base:
            continue  # the base modules import one another (without a cycle: test_import_graph)
        upward = sorted(t for t in targets if t not in base and rank[t] >= rank[unit])
        assert not upward, f"{unit} ({LAYERS[rank[unit]][0]}) imports {upward}, which are not below it"


@pytest.mark.parametrize("package", ["redirect", "routing", "k8s"])
def test_no_layer_above_the_backends_asks_which_chip_it_is(package):
    # "cuda" is what user code names and the redirection translates, not a chip it asks about
    chip_names = r"(cpu|sim|rocm|ascend|cambricon|mthreads|xpu|mps|npu|mlu|musa)"
    patterns = [r"\bis_cpu\b", r"\b_host\b", r"\b(backend|chip|target)\.name\s*==",
                r"\bbackend\s*==\s*[\"']", rf"==\s*[\"']{chip_names}[\"']"]
    for path in (SRC / package).rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pattern in patterns:
            assert not re.search(pattern, text), f"{path.relative_to(SRC)} matches {pattern}"
