"""The precision settings through ``ft.init_backend("cpu")``: PyTorch's CPU autocast lists stay as
they are, ``FL_FP32_OPS`` and ``ft.set_op_precision`` change an operator's input dtype under
``torch.autocast("cuda")``, ``FL_CHECK_FINITE`` catches a planted overflow; all undone on
deactivate."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl.precision import NonFiniteError
from tests.precision.dtypes import InputDtypes


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in ("FL_FP32_OPS", "FL_CHECK_FINITE", "FL_MIXED_PRECISION", "FL_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    ft.deactivate()
    yield
    ft.deactivate()


def gelu_inputs():
    lin = torch.nn.Linear(8, 8).cuda()
    with torch.autocast("cuda", torch.bfloat16), InputDtypes() as seen:
        torch.nn.functional.gelu(lin(torch.randn(4, 8, device="cuda")))
    return seen.seen["aten::gelu"]


def test_fp32_ops_and_set_op_precision_on_the_cpu_key(monkeypatch):
    monkeypatch.setenv("FL_FP32_OPS", "gelu")
    ft.init_backend("cpu")
    assert gelu_inputs() == [(torch.float32,)]
    ft.deactivate()
    monkeypatch.delenv("FL_FP32_OPS")
    ft.init_backend("cpu")
    assert gelu_inputs() == [(torch.bfloat16,)]  # PyTorch's CPU list leaves gelu alone
    undo = ft.set_op_precision("gelu")
    assert gelu_inputs() == [(torch.float32,)]
    undo()
    assert gelu_inputs() == [(torch.bfloat16,)]


def test_set_op_precision_needs_a_backend_and_a_known_name():
    with pytest.raises(RuntimeError, match="no backend is active"):
        ft.set_op_precision("gelu")
    ft.init_backend("cpu")
    with pytest.raises(ft.ConfigError, match="softmx"):
        ft.set_op_precision("softmx")


def test_finite_guard_from_the_environment(monkeypatch):
    monkeypatch.setenv("FL_CHECK_FINITE", "1")
    ft.init_backend("cpu")
    with pytest.raises(NonFiniteError, match=r"aten::exp \(route: native\)"):
        torch.full((2,), 100.0, device="cuda").exp()
    ft.deactivate()
    assert torch.isinf(torch.full((2,), 100.0).exp()).all()


def test_a_bad_fp32_ops_name_is_refused_before_anything_changes(monkeypatch):
    zeros = torch.zeros
    monkeypatch.setenv("FL_FP32_OPS", "softmaxx")
    with pytest.raises(ft.ConfigError, match="FL_FP32_OPS.*softmaxx"):
        ft.init_backend("cpu")
    assert ft.current_backend() is None and torch.zeros is zeros
