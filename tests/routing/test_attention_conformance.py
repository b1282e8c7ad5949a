"""``scaled_dot_product_attention`` on the sim (its composite, math attention) against the
CPU's kernels, gradients included: softmax's backward computes in the CPU kernel's order of
operations, and without dropout the sim's gradients are those of the CPU's math kernel (the
CPU's fused flash kernel, which the CPU picks for such calls, rounds differently)."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
aten = torch.ops.aten


@pytest.fixture(scope="module")
def router():
    from tests.routing.simutil import start_sim

    router, undo = start_sim()
    yield router
    undo()


def _qkv(seed: int):
    """Query, key and value shaped as the OpInfo's 4-d samples (batch 4, 4 heads, 3 queries,
    6 keys, head dim 8), uniform in [-9, 9) as ``make_tensor`` makes them."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(4, 4, n, 8, generator=gen) * 18 - 9 for n in (3, 6, 6)]


def _grads(fn, inputs, device: str, weight: torch.Tensor):
    leaves = [t.to(device).requires_grad_() for t in inputs]
    out = fn(*leaves)
    return [g.cpu() for g in torch.autograd.grad(out, leaves, weight.to(device))]


def test_softmax_backward_runs_in_the_cpu_kernels_order(router):
    # an attention with dropout, given the mask the CPU's dropout draws for seed 42: with torch's
    # decomposition (grad * out - out * sum) the query's gradient was 1.1e-5 off the CPU's
    q, k, v = _qkv(16)
    torch.manual_seed(42)
    mask = torch.empty(4, 4, 3, 6).bernoulli_(0.5).bool()
    weight = torch.randn(4, 4, 3, 8, generator=torch.Generator().manual_seed(1))

    def attention(q, k, v):
        return aten._scaled_dot_product_attention_math(q, k, v, None, 0.5, False,
                                                       dropout_mask=mask.to(q.device))[0]

    expected = _grads(attention, (q, k, v), "cpu", weight)
    actual = _grads(attention, (q, k, v), "sim", weight)
    torch.testing.assert_close(actual, expected)
    decision = router.decision_for(aten._softmax_backward_data.out)
    assert decision.route == "composite" and "CPU kernel's order" in decision.detail


@pytest.mark.parametrize("is_causal", [True, False])
def test_attention_without_dropout_has_the_cpu_math_kernels_gradients(router, is_causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(3)
    weight = torch.randn(4, 4, 3, 8, generator=torch.Generator().manual_seed(2))

    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    with sdpa_kernel([SDPBackend.MATH]):
        expected = _grads(attention, (q, k, v), "cpu", weight)
    torch.testing.assert_close(_grads(attention, (q, k, v), "sim", weight), expected)
