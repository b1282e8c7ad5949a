"""The first random operator after ``manual_seed(s)`` draws on the sim what the CPU draws after
``torch.manual_seed(s)`` (the sim's kernels are the CPU's and the device generator's engine at
offset 0 is seeded with the seed itself), so PyTorch's seeded OpInfo samples that draw once
(attention with dropout, ``svd_lowrank``'s random basis) give the CPU's results on the sim."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def router():
    from tests.routing.simutil import start_sim

    router, undo = start_sim()
    yield router
    undo()


def _seeded(fn, *inputs, device: str):
    torch.manual_seed(42)
    out = fn(*(t.to(device) for t in inputs))
    return [t.cpu() for t in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("fn", [
    lambda x: torch.nn.functional.dropout(x, 0.5),
    lambda x: torch.randn(x.shape, device=x.device),
    lambda x: torch.rand_like(x),
    lambda x: torch.empty_like(x).bernoulli_(0.3),
    lambda x: torch.randint(0, 100, x.shape, device=x.device),
], ids=["dropout", "randn", "rand_like", "bernoulli_", "randint"])
def test_first_draw_after_manual_seed_is_the_cpus(router, fn):
    x = torch.randn(5, 33)
    assert all(torch.equal(a, e) for a, e in zip(_seeded(fn, x, device="sim"), _seeded(fn, x, device="cpu")))


def test_later_draws_follow_the_offset_not_the_cpu_stream(router):
    torch.manual_seed(42)
    first, second = torch.rand(8, device="sim").cpu(), torch.rand(8, device="sim").cpu()
    assert torch.sim.default_generators[0].get_offset() == 16
    torch.manual_seed(42)
    assert torch.equal(first, torch.rand(8)) and not torch.equal(second, first)


def _opinfo(name: str):
    from tests.e2e.conformance import harness

    return next(op for op in harness.float32_opinfos() if harness.opinfo_id(op) == name)


@pytest.mark.parametrize("name", ["nn.functional.scaled_dot_product_attention", "svd_lowrank",
                                  "nn.functional.multi_head_attention_forward"])
def test_seeded_opinfo_samples_match_the_cpu(router, name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tests.e2e.conformance import harness

    # both devices compute attention with the math kernel: the CPU's fused flash kernel, which it
    # picks for some samples (which ones changes between torch releases), rounds differently
    with sdpa_kernel([SDPBackend.MATH]):
        outcomes = harness.run_opinfo(_opinfo(name), router)
    failed = {o.sample: o.error for o in outcomes if not o.ok}
    assert outcomes and not failed, failed
