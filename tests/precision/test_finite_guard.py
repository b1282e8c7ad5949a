"""The finite guard: a planted overflow raises at the operator that made it, naming the operator
and its route; deliberate infinities and propagation do not; undo turns it off."""
from __future__ import annotations

import pytest
import torch

from flagos_torchfl import variables
from flagos_torchfl.errors import ConfigError
from flagos_torchfl.precision import (FiniteGuard, NonFiniteError, check_finite,
                                      check_finite_from_env)


def test_fp16_exp_overflow_names_operator_and_route():
    routes = {"aten::exp": "library"}
    undo = check_finite_from_env({"FL_CHECK_FINITE": "1"}, lambda op: routes.get(op, "native"))
    try:
        x = torch.full((4,), 20.0, dtype=torch.float16)
        y = x * 2  # finite
        with pytest.raises(NonFiniteError) as caught:
            y.exp()
    finally:
        undo()
    assert caught.value.op == "aten::exp" and caught.value.route == "library"
    assert "aten::exp (route: library)" in str(caught.value) and "float16[4]" in str(caught.value)
    assert torch.full((2,), 20.0, dtype=torch.float16).exp().isinf().all()  # off again


def test_division_by_zero_in_place_and_default_route():
    with FiniteGuard():
        with pytest.raises(NonFiniteError, match=r"aten::div\.Tensor \(route: native\)"):
            torch.ones(3) / torch.zeros(3)
        with pytest.raises(NonFiniteError, match=r"aten::div_\.Scalar|aten::div_\.Tensor"):
            torch.ones(3).div_(0.0)


def test_deliberate_infinities_and_propagation_pass():
    with FiniteGuard():
        mask = torch.tensor([True, False, False])
        scores = torch.zeros(3).masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, 0)
        assert torch.isfinite(probs).all()
        assert torch.full((2,), float("inf")).add(1).isinf().all()  # inf in, inf out
        torch.empty(1000)  # uninitialised memory is not checked


def test_backward_overflow_is_caught():
    w = torch.tensor([1.0], requires_grad=True)
    undo = check_finite(True)
    try:
        loss = torch.sqrt(w - 1.0).sum()  # finite forward, infinite gradient
        with pytest.raises(NonFiniteError, match="aten::"):
            loss.backward()
    finally:
        undo()


def test_switch_parsing():
    def read(text):
        return variables.read("FL_CHECK_FINITE", {"FL_CHECK_FINITE": text})

    assert read("on") and not read("0") and not read("")
    with pytest.raises(ConfigError, match="FL_CHECK_FINITE"):
        read("maybe")
    check_finite(False)()  # a no-op undo
