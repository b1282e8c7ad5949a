"""``python -m flagos_torchfl ops``: routes per operator, category coverage, and the export /
replay round trip (a chip's native table replayed on the sim)."""
from __future__ import annotations

import json

import pytest

from flagos_torchfl import compat
from tests.helpers import run_python

MODEL = r"""
import torch
from tests.routing.simutil import start_sim
from flagos_torchfl.routing import report
router, _ = start_sim()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
x = torch.randn(2, 3, 8, 8)
expected = net(x)
got = net.to("sim")(x.to("sim"))
torch.testing.assert_close(got.cpu(), expected)
print("NATIVE", len(router.policy.native))
print(report.render())
"""


def export_cpu_table(path):
    done = run_python(["-m", "flagos_torchfl", "ops", "--backend", "cpu", "--export", str(path)])
    assert done.returncode == 0, done.stderr
    assert f"replay with FL_SIM_NATIVE_OPS={path}" in done.stdout
    return done


def test_export_writes_the_native_table(tmp_path):
    import torch

    table = tmp_path / "cpu_ops.json"
    export_cpu_table(table)
    data = json.loads(table.read_text())
    assert data["backend"] == "cpu" and data["torch"] == torch.__version__
    assert "aten::add.Tensor" in data["native_ops"] and len(data["native_ops"]) > 1000
    assert "aten::cudnn_convolution" not in data["native_ops"]


@pytest.mark.needs_sim
def test_export_then_replay_on_the_sim(tmp_path):
    table = tmp_path / "cpu_ops.json"
    export_cpu_table(table)
    planned = run_python(["-m", "flagos_torchfl", "ops", "--backend", "sim", "--json"],
                         env={"FL_SIM_NATIVE_OPS": str(table)})
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["routes"]["native"] > 900 and plan["categories"]["routed"] == []
    ran = run_python(["-c", MODEL], env={"FL_SIM_NATIVE_OPS": str(table)}, timeout=300)
    assert ran.returncode == 0, ran.stderr
    # the CPU's table has no convolution_overrideable: on that "chip" convolution falls back
    assert "aten::convolution_overrideable" in ran.stdout and "fallback" in ran.stdout


def _route_table(*args):
    """``ops ARGS``' lines and its operator -> route rows (the command must succeed)."""
    done = run_python(["-m", "flagos_torchfl", "ops", *args])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["OPERATOR", "ROUTE", "DETAIL"]
    return lines, {line.split()[0]: line.split()[1] for line in lines[1:] if line.startswith("aten::")}


def test_routes_of_every_operator_on_the_cpu():
    # what reaches the CPU's key without a kernel: decompositions, host equivalents, no route
    lines, rows = _route_table("--backend", "cpu")
    assert rows["aten::add.Tensor"] == "native" and rows["aten::_thnn_fused_lstm_cell"] == "composite"
    assert rows["aten::convolution_overrideable"] == "fallback"
    assert rows["aten::cudnn_convolution"] == "unsupported"
    assert lines[-1].startswith("cpu: ") and "common categories native" in lines[-1]
    assert set(_route_table("--backend", "cpu", "--route", "unsupported")[1].values()) == {"unsupported"}


@pytest.mark.needs_sim
def test_routes_of_every_operator_on_the_sim():
    lines, rows = _route_table("--backend", "sim")
    assert rows["aten::add.Tensor"] == "native" and rows["aten::silu.out"] == "composite"
    assert rows["aten::histc"] == "fallback" and rows["aten::cudnn_convolution"] == "unsupported"
    assert "common categories native" in lines[-1]
    assert set(_route_table("--backend", "sim", "--route", "composite")[1].values()) == {"composite"}


@pytest.mark.parametrize("chip", [pytest.param(("--backend", "sim"), marks=pytest.mark.needs_sim, id="sim"),
                                  pytest.param(("--profile", "ascend"), id="ascend-profile")])
def test_overrides_show_in_the_plan(chip):
    done = run_python(["-m", "flagos_torchfl", "ops", *chip, "--json"], env={"FL_OP_ROUTE": "softmax=cpu"})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["op"]: r for r in json.loads(done.stdout)["operators"]}
    assert rows["aten::_softmax"]["route"] == "fallback"
    assert rows["aten::_softmax"]["detail"] == "FL_OP_ROUTE sets softmax=cpu"


@pytest.mark.needs_sim
def test_categories_on_the_sim():
    cats = run_python(["-m", "flagos_torchfl", "ops", "--backend", "sim", "--categories"])
    assert "native  matmul" in cats.stdout and "routed  " in cats.stdout


def test_categories_of_a_profile_and_names():
    cats = run_python(["-m", "flagos_torchfl", "ops", "--profile", "cambricon", "--categories"])
    assert cats.returncode == 0, cats.stdout + cats.stderr
    listed = [line.split() for line in cats.stdout.splitlines() if line.startswith(("native  ", "routed  "))]
    assert ["native", "matmul"] in listed and len(listed) == len(json.loads(
        run_python(["-m", "flagos_torchfl", "ops", "--names", "--json"]).stdout)["categories"])
    names = run_python(["-m", "flagos_torchfl", "ops", "--names"])
    assert "SDPA -> attention" in names.stdout and "layer_norm" in names.stdout


def test_a_chip_that_is_not_here_is_a_clear_error():
    done = run_python(["-m", "flagos_torchfl", "ops", "--backend", "ascend", "--export", "x.json"])
    assert done.returncode == 1 and "backend 'ascend' is not available" in done.stdout


@pytest.mark.needs_sim
def test_bad_native_ops_name_is_a_clear_error():
    done = run_python(["-m", "flagos_torchfl", "ops", "--backend", "sim"], env={"FL_SIM_NATIVE_OPS": "add,sofmax"})
    assert done.returncode == 1 and "sofmax" in done.stdout


def test_detect_shows_category_coverage():
    done = run_python(["-m", "flagos_torchfl", "detect", "--json"])
    rows = {r["name"]: r for r in json.loads(done.stdout)["backends"]}
    total = rows["cpu"]["categories"].split("/")[1]
    assert rows["cpu"]["categories"] == f"{total}/{total}"
    if compat.has("python_privateuse1_backend"):
        assert rows["sim"]["categories"].endswith(f"/{total}")
    else:  # the sim is not here on this torch: no coverage, like a chip that is absent
        assert rows["sim"]["categories"] is None
    assert rows["ascend"]["categories"] is None
    text = run_python(["-m", "flagos_torchfl", "detect"]).stdout
    assert "CATEGORIES" in text.splitlines()[0]
