"""Test harness.

Modules that set ``pytestmark = pytest.mark.isolated`` run in a fresh interpreter of their own:
things that cannot be undone inside one process (claiming PyTorch's PrivateUse1 slot for ``sim``,
importing a fake vendor plugin) must not leak into other tests. The first test of such a module
runs the whole module once in a child pytest; each test then reports its own outcome from there.
"""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

IN_CHILD = os.environ.get("FL_TEST_ISOLATED_CHILD") == "1"
ROOT = Path(__file__).resolve().parent.parent
_results: dict[str, dict[str, tuple[str, str]]] = {}


#: test folders that need the sim device throughout (its own floor: compat.SIM_MIN_TORCH)
SIM_SUITES = ("sim", "profiles", "conformance")


def pytest_configure(config):
    config.addinivalue_line("markers", "isolated: run this module in a fresh interpreter")
    config.addinivalue_line(
        "markers", "torch_feature(name): needs compat feature NAME of the torch under test; "
        "skipped, with the reason, on a torch without it")
    config.addinivalue_line("markers", "needs_sim: needs the sim device (torch_feature python_privateuse1_backend)")


def _torch_feature_skips(items) -> None:
    """Tests that cannot apply to the torch under test (it lacks what they exercise) are
    skipped with the reason, so the summary counts them as skipped, never as passed."""
    import torch

    from flagos_torchfl import compat

    for item in items:
        names = [m.args[0] for m in item.iter_markers("torch_feature")]
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT / "tests").parts
        if item.get_closest_marker("needs_sim") is not None or (rel and rel[0] in SIM_SUITES):
            names.append("python_privateuse1_backend")
        missing = [n for n in names if not compat.has(n)]
        if missing:
            what = "; ".join(compat.FEATURES[n].what for n in missing)
            item.add_marker(pytest.mark.skip(reason=f"torch {torch.__version__} lacks {what}"))


def _run_module_in_child(path: Path, tmp_dir: Path) -> dict[str, tuple[str, str]]:
    report = tmp_dir / f"{path.stem}.xml"
    env = dict(os.environ, FL_TEST_ISOLATED_CHILD="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider",
         f"--junitxml={report}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )
    outcomes: dict[str, tuple[str, str]] = {}
    if report.exists():
        for case in ET.parse(report).iter("testcase"):
            name = case.get("name")
            outcome, detail = "passed", ""
            for tag in ("failure", "error", "skipped"):
                node = case.find(tag)
                if node is not None:
                    outcome = tag
                    detail = (node.get("message") or "") + "\n" + (node.text or "")
            outcomes[name] = (outcome, detail)
    outcomes["<process>"] = ("exit", f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return outcomes


def pytest_runtest_call(item):
    if IN_CHILD or item.get_closest_marker("isolated") is None:
        return None
    path = Path(item.fspath)
    if str(path) not in _results:
        tmp_dir = item.config._tmp_path_factory.mktemp("isolated")  # type: ignore[attr-defined]
        _results[str(path)] = _run_module_in_child(path, tmp_dir)
    outcomes = _results[str(path)]
    outcome, detail = outcomes.get(item.name, ("missing", outcomes["<process>"][1]))
    if outcome == "skipped":
        pytest.skip(detail.strip().splitlines()[0] if detail.strip() else "skipped in child")
    if outcome != "passed":
        pytest.fail(f"[isolated child] {outcome}:\n{detail}", pytrace=False)


def pytest_collection_modifyitems(items):
    _torch_feature_skips(items)
    # In the parent, an isolated test's fixtures are not set up either: they may do what cannot
    # be undone (the child sets them up for real).
    if not IN_CHILD:
        for item in items:
            if item.get_closest_marker("isolated") is not None:
                item.fixturenames[:] = [n for n in item.fixturenames if n in ("request",)]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    # In the parent, an isolated test's body already ran in the child: do not run it again here.
    if not IN_CHILD and pyfuncitem.get_closest_marker("isolated") is not None:
        return True
    return None
