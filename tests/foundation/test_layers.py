"""The layout is the architecture: imports point down, and only backends know chips."""
from __future__ import annotations

import ast
import re

import pytest

from tests.helpers import ROOT

SRC = ROOT / "src" / "flagos_torchfl"
#: package -> the packages of flagos_torchfl it may import (besides errors, log, variables, config, compat,
#: autoload, atomic_file, inline, optimizer_steps)
ALLOWED = {
    "aten": set(),
    "sim": {"aten"},
    "backends": {"aten", "sim", "entry_points"},
    "routing": {"aten", "backends", "entry_points"},
    "redirect": {"backends"},
    "k8s": {"backends"},
}
BASE = {"errors", "log", "variables", "config", "compat", "autoload", "atomic_file", "inline", "optimizer_steps"}


def imported_packages(path):
    """The first component of every flagos_torchfl module ``path`` imports (relative or absolute)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = path.relative_to(SRC).parts[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level >= 2 or (node.level == 1 and path.parent == SRC):
                names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                found.update(names)
            elif node.module and node.module.startswith("flagos_torchfl."):
                found.add(node.module.split(".")[1])
    return found - {package}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_down(package):
    for path in (SRC / package).rglob("*.py"):
        extra = imported_packages(path) - ALLOWED[package] - BASE
        assert not extra, f"{path.relative_to(SRC)} imports {sorted(extra)}"


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
