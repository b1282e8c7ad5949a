"""Per-operator precision on the CPU's autocast key: the operator receives float32 inputs under
autocast, nothing changes outside it, and undo brings PyTorch's own rule back."""
from __future__ import annotations

import pytest
import torch

from flagos_torchfl.errors import ConfigError
from flagos_torchfl.precision import (force_float32, fp32_ops_from_env, operators_for, parse_fp32_ops,
                                      set_op_precision)
from tests.precision.dtypes import InputDtypes


def step(lin, ln, x):
    with torch.autocast("cpu", torch.bfloat16), InputDtypes() as seen:
        h = lin(x)
        torch.softmax(h, -1)
        ln(h)
    return seen.seen


@pytest.fixture
def model():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.randn(4, 8)


def test_forced_operators_receive_float32_and_undo_restores(model):
    before = step(*model)
    assert before["aten::_softmax"] == [(torch.bfloat16,)]
    assert before["aten::native_layer_norm"][0][0] == torch.bfloat16
    undo = force_float32(fp32_ops_from_env({"FL_FP32_OPS": "softmax, LayerNorm"}), "cpu")
    try:
        forced = step(*model)
    finally:
        undo()
    assert forced["aten::_softmax"] == [(torch.float32,)]
    assert forced["aten::native_layer_norm"][0][0] == torch.float32
    assert forced["aten::addmm"] == before["aten::addmm"]  # others untouched
    assert step(*model) == before


def test_linear_overrides_pytorchs_own_cpu_rule(model):
    lin, _, x = model
    undo = set_op_precision("linear", torch.float32, "cpu")
    try:
        with torch.autocast("cpu", torch.bfloat16):
            assert lin(x).dtype == torch.float32
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::linear", "AutocastCPU")
    finally:
        undo()
    with torch.autocast("cpu", torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16  # PyTorch's lower-precision rule is back


@pytest.mark.torch_feature("cpu_float16_matmul")
def test_stacked_settings_undo_in_any_order(model):
    lin, _, x = model
    first = set_op_precision("linear", torch.float32, "cpu")
    second = set_op_precision("linear", torch.float16, "cpu")
    with torch.autocast("cpu", torch.bfloat16):
        assert lin(x).dtype == torch.float16
    first()
    with torch.autocast("cpu", torch.bfloat16):
        assert lin(x).dtype == torch.float16
    second()
    with torch.autocast("cpu", torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16


def test_outside_autocast_nothing_changes(model):
    lin, _, x = model
    undo = set_op_precision("linear", torch.bfloat16, "cpu")
    try:
        assert lin(x).dtype == torch.float32
    finally:
        undo()


def test_names_and_errors():
    assert operators_for("softmax") >= {"aten::_softmax", "aten::softmax.int"}
    assert not any("backward" in o or o.endswith(".out") for o in operators_for("softmax"))
    assert parse_fp32_ops(" softmax ,layer_norm,") == ["softmax", "layer_norm"]
    with pytest.raises(ConfigError, match="FL_FP32_OPS.*softmaxx"):
        parse_fp32_ops("softmaxx")
    with pytest.raises(ConfigError, match="torch.float32"):
        set_op_precision("softmax", torch.int32, "cpu")
    assert fp32_ops_from_env({}) == () and force_float32((), "cpu")() is None
