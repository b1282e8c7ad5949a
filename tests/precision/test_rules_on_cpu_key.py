"""The cast policies, exercised on the CPU's autocast key (CUDA's rules registered over
PyTorch's CPU ones with ``replace=True``, undone after each test)."""
from __future__ import annotations

import pytest
import torch

from flagos_torchfl import compat
from flagos_torchfl.aten import dispatcher
from flagos_torchfl.precision import register_autocast_rules
from flagos_torchfl.precision.autocast_rules import listed_ops


@pytest.fixture
def cuda_rules_on_cpu():
    reg = register_autocast_rules("cpu", "AutocastCPU", replace=True)
    yield reg
    reg()


def bf16():
    return torch.autocast("cpu", torch.bfloat16)


def test_replace_registers_every_operator_and_undo_restores_cpu_rules():
    x, w = torch.randn(4, 8), torch.randn(3, 8)

    def dtypes():
        with bf16():
            h = torch.nn.functional.linear(x, w)
            return h.dtype, torch.softmax(h, -1).dtype

    assert dtypes() == (torch.bfloat16, torch.bfloat16)  # PyTorch's CPU lists: no softmax rule
    reg = register_autocast_rules("cpu", "AutocastCPU", replace=True)
    try:
        # every listed operator this torch has (119 of 119 on 2.13; torch 2.1 has no aten::rms_norm)
        present = frozenset(dispatcher.all_aten())
        assert reg.kept == () and set(reg.registered) == {op for op in listed_ops() if op in present}
        assert len(reg.registered) >= 118 and ("aten::rms_norm" in reg.registered) == ("aten::rms_norm" in present)
        assert dtypes() == (torch.bfloat16, torch.float32)   # CUDA's: softmax fp32_set_opt_dtype
    finally:
        reg()
    reg()  # idempotent
    assert dtypes() == (torch.bfloat16, torch.bfloat16)


def test_without_replace_pytorch_cpu_rules_are_kept():
    reg = register_autocast_rules("cpu", "AutocastCPU")
    try:
        assert "aten::linear" in reg.kept and "aten::mm" in reg.kept
        assert "aten::softmax.int" in reg.registered  # CPU has no rule for it
    finally:
        reg()


def test_policies(cuda_rules_on_cpu):
    x = torch.randn(4, 8)
    w = torch.randn(3, 8)
    with bf16():
        assert torch.nn.functional.linear(x, w).dtype == torch.bfloat16          # lower
        h = torch.nn.functional.linear(x, w)
        assert h.exp().dtype == torch.float32                                   # fp32
        assert torch.nn.functional.layer_norm(h, (3,)).dtype == torch.float32
        assert torch.log_softmax(h, -1).dtype == torch.float32                  # set_opt_dtype
        assert torch.softmax(h, -1, dtype=torch.bfloat16).dtype == torch.bfloat16  # explicit wins
        assert h.sum().dtype == torch.float32
        assert torch.arange(4).sum().dtype == torch.int64                       # not eligible
        assert h.norm().dtype == torch.float32                                  # append_dtype
        assert torch.norm(h, dim=1).dtype == torch.float32
        assert torch.addcmul(h, h, h).dtype == torch.bfloat16                   # promote
        assert torch.addcmul(h, h, x[:, :3]).dtype == torch.float32
        assert torch.addcmul(h.double(), h.double(), h.double()).dtype == torch.float64
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            torch.nn.functional.binary_cross_entropy(torch.sigmoid(h.float()), torch.rand(4, 3))
        with pytest.raises(RuntimeError, match="promote needs inputs"):
            torch.addcmul(h, h.half(), h)
    if compat.has("autocast_cpu_float16"):  # the autocast dtype in force, read per call
        with torch.autocast("cpu", torch.float16):
            assert torch.nn.functional.linear(x, w).dtype == torch.float16
    assert torch.nn.functional.linear(x, w).dtype == torch.float32          # autocast off
    assert torch.softmax(x, -1).dtype == torch.float32


def test_results_equal_pytorch_where_lists_agree(cuda_rules_on_cpu):
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8), torch.randn(3, 8), torch.randn(3)
    with bf16():
        ours = torch.nn.functional.linear(x, w, b), torch.nn.functional.mse_loss(x, x * 0.5)
    cuda_rules_on_cpu()
    with bf16():
        theirs = torch.nn.functional.linear(x, w, b), torch.nn.functional.mse_loss(x, x * 0.5)
    for a, c in zip(ours, theirs):
        assert a.dtype == c.dtype and torch.equal(a, c)


def test_backward_through_casts(cuda_rules_on_cpu):
    lin = torch.nn.Linear(8, 3)
    x = torch.randn(4, 8, requires_grad=True)
    with bf16():
        loss = torch.log_softmax(lin(x), -1).sum()
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    assert torch.isfinite(lin.weight.grad).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="not an autocast dispatch key"):
        register_autocast_rules("cpu", "CPU")
    with pytest.raises(ValueError, match="not in CUDA's autocast lists"):
        register_autocast_rules("cpu", "AutocastCPU", ops=["aten::relu"])
    with pytest.raises(ValueError, match="no autocast"):
        register_autocast_rules("meta")
