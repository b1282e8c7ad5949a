"""The per-operator registration path (what a torch without a Python backend fallback, 2.1 to
2.4, gets), forced with FL_ROUTING_REGISTRATION=per-op. Without the sim, the same path is
tested on the host's key (test_router_on_the_host_key.py)."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def router():
    from tests.routing.simutil import start_sim

    router, undo = start_sim({"FL_ROUTING_REGISTRATION": "per-op"})
    yield router
    undo()


def test_no_backend_fallback_only_per_operator_kernels(router):
    from flagos_torchfl.aten import dispatcher

    assert not router.uses_fallback
    assert not torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.PrivateUse1)
    routable = set(dispatcher.routable(router.policy.native))
    assert routable <= set(router.registered) and len(routable) > 500
    assert not set(router.registered) & router.policy.native
    assert not any(dispatcher.is_implicit(name) for name in router.registered)


def test_routes_work_through_per_operator_kernels(router):
    x = torch.randn(4, 6)
    dx = x.to("sim")
    torch.testing.assert_close(torch.nn.functional.silu(dx).cpu(), torch.nn.functional.silu(x))
    torch.testing.assert_close(torch.histc(dx, bins=5).cpu(), torch.histc(x, bins=5))
    routes = {name.partition(".")[0]: d.route for name, _, _, d in router.cached()}
    assert routes["aten::silu"] == "composite" and routes["aten::histc"] == "fallback"


def test_uninstall_removes_every_registration(router):
    name = "aten::histc"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
    router.uninstall()
    try:
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
        assert router.registered == {}
    finally:
        router.install("per-op")
