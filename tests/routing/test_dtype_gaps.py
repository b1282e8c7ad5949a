"""A backend declaring dtype gaps: operators it has natively but not for some dtypes get a route
for those dtypes only, and run natively otherwise."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
aten = torch.ops.aten


@pytest.fixture(scope="module")
def router():
    import flagos_torchfl as ft
    from flagos_torchfl.backends.sim import SimBackend
    from tests.routing.simutil import start_sim

    class GappySim(SimBackend):
        """The sim, declared without float64 matrix products nor float64 exp."""

        name = "gappy-sim"
        aliases = ()
        dtype_gaps = {"float64": ("matmul", "aten::exp")}

    ft.register_backend(GappySim)
    router, undo = start_sim(backend="gappy-sim")
    yield router
    undo()


def test_gap_operators_get_a_dtype_kernel(router):
    assert {"aten::mm", "aten::exp"} <= set(router.policy.dtype_gaps)
    assert router.registered["aten::mm"] == "the backend lacks it for some dtypes"
    assert "aten::add.Tensor" not in router.registered


def test_native_dtypes_run_natively(router):
    before = router.decisions
    a = torch.randn(4, 3, device="sim")
    torch.mm(a, a.t())
    torch.exp(a)
    assert router.decisions == before and router.cached() == []


def test_gap_dtypes_are_routed(router):
    a = torch.randn(4, 3, dtype=torch.float64)
    got = torch.mm(a.to("sim"), a.to("sim").t())
    torch.testing.assert_close(got.cpu(), a @ a.t())
    decision = router.decision_for(aten.mm.default, (torch.float64,))
    assert decision.route == "fallback"
    assert dict(decision.tried)["native"] == "gappy-sim lacks torch.float64 for it"
    torch.testing.assert_close(torch.exp(a.to("sim")).cpu(), torch.exp(a))
    assert router.decision_for(aten.exp.default, (torch.float64,)).route in ("composite", "fallback")
