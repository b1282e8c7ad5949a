"""A chip added by a third party in one file, through the entry point: with a partial operator
set and a visible-devices variable of its own, ``detect``, ``env``, ``ops``, routing and the
redirection all pick it up with no change to this package."""
from __future__ import annotations

import json

import pytest

from tests.helpers import install_fixture, prepend_path, run_python

#: fakeaccel is a Python-registered PrivateUse1 chip, as the sim is
pytestmark = pytest.mark.needs_sim


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return prepend_path({}, "PYTHONPATH", install_fixture("fake_accel", tmp_path_factory))


def test_detect_lists_the_new_chip(env):
    proc = run_python(["-m", "flagos_torchfl", "detect", "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)["backends"]}
    row = rows["fakeaccel"]
    assert row["status"] == "on-request" and row["vendor"] == "Fake Accelerators Ltd."
    assert row["visible_devices_env"] == "FAKEACCEL_VISIBLE_DEVICES"
    assert row["categories"] is not None and row["categories"] != rows["sim"]["categories"]


def test_env_reports_its_visible_devices_variable(env):
    proc = run_python(["-m", "flagos_torchfl", "env"], env={**env, "FAKEACCEL_VISIBLE_DEVICES": "1,0"})
    assert proc.returncode == 0, proc.stderr
    assert "FAKEACCEL_VISIBLE_DEVICES=1,0" in proc.stdout
    assert "fakeaccel:" in proc.stdout


def test_ops_plans_routes_from_its_partial_set(env):
    proc = run_python(["-m", "flagos_torchfl", "ops", "--backend", "facc", "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    routes = {row["op"]: row["route"] for row in data["operators"]}
    assert data["backend"] == "fakeaccel"
    assert routes["aten::mm"] == "native" and routes["aten::relu"] == "native"
    assert routes["aten::gelu.out"] in ("composite", "fallback")  # gelu arrives as gelu.out
    assert routes["aten::sub.out"] != "native"
    assert data["routes"]["native"] < 150  # the partial set plus the runtime primitives


def test_cuda_code_runs_on_it_and_missing_operators_are_routed(env):
    code = """
import torch, torch.nn.functional as F
import flagos_torchfl as ft
s = ft.init_backend("fakeaccel")
x = torch.randn(4, 3, device="cuda")
w = torch.nn.Linear(3, 2).cuda()
y = F.gelu(w(x)) - 1
with torch.autocast("cuda"):
    pass
rows = {r["op"]: r["route"] for r in ft.routing_report()}
print(s.backend, s.device_type, y.device.type, torch.cuda.device_count(), torch.get_autocast_dtype("sim"))
print(sorted(op for op in rows if "gelu" in op or "sub" in op), sorted(set(rows.values())))
"""
    proc = run_python(["-c", code], env=env)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()
    assert first == "fakeaccel sim sim 1 torch.float16"
    assert "aten::gelu" in second and "aten::sub" in second
    assert "composite" in second or "fallback" in second
