"""PyTorch's own device-generic tests (vendored under tests/fixtures/pytorch_tests) run for the
CPU plainly and for the sim with the package active, each in a child interpreter, as PyTorch
documents for out-of-tree backends (``instantiate_device_type_tests`` makes the PrivateUse1
classes): every test that passes on the CPU passes on the sim, except those
``sim_differences.json`` lists with a reason."""
from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_python

pytestmark = pytest.mark.full

FIXTURES = ROOT / "tests" / "fixtures" / "pytorch_tests"
MODULES = ["test_shape_ops.py"]


def _outcomes(device: str, tmp_path) -> dict:
    out = tmp_path / f"{device}.json"
    done = run_python([str(FIXTURES / "run_device_tests.py"), device, str(out),
                       *(str(FIXTURES / m) for m in MODULES)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())["outcomes"]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("device_tests")
    return _outcomes("cpu", tmp), _outcomes("sim", tmp)


def _listed() -> dict:
    return json.loads((FIXTURES / "sim_differences.json").read_text())["differences"]


def test_the_sim_classes_are_instantiated(outcomes):
    cpu, sim = outcomes
    assert len(sim) >= 90 and set(sim) == set(cpu)


def test_what_passes_on_the_cpu_passes_on_the_sim(outcomes):
    cpu, sim = outcomes
    listed = _listed()
    unexplained = {
        name: sim[name] for name, (outcome, _) in cpu.items()
        if outcome == "passed" and sim[name][0] != "passed" and name not in listed
        and not (sim[name][0] == "skipped" and sim[name][1].startswith("Only runs on"))
    }
    assert unexplained == {}


def test_every_listed_difference_still_differs(outcomes):
    cpu, sim = outcomes
    for name, reason in _listed().items():
        assert reason and cpu[name][0] == "passed", name
        assert sim[name][0] != "passed", f"{name} passes on the sim now: remove its entry"
