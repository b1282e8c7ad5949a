"""Routing as users get it: ``ft.init_backend("sim")`` activates it (with FL_OP_ROUTE read at
activation), ``ft.routing_report()`` reports, ``ft.deactivate()`` removes it."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


def test_init_backend_routes_and_deactivate_undoes():
    import flagos_torchfl as ft
    from flagos_torchfl import routing

    os.environ["FL_OP_ROUTE"] = "gelu=cpu"
    try:
        ft.init_backend("sim")
    finally:
        del os.environ["FL_OP_ROUTE"]
    router = routing.active_router()
    assert router is not None and router.uses_fallback
    assert "aten::gelu" in router.registered
    x = torch.randn(5, device="cuda")  # the launcher-free CUDA spelling, redirected to the sim
    assert x.device.type == "sim"
    torch.testing.assert_close(torch.nn.functional.gelu(x).cpu(), torch.nn.functional.gelu(x.cpu()))
    rows = {r["op"]: r for r in ft.routing_report()}
    assert rows["aten::gelu"]["route"] == "fallback" and rows["aten::gelu"]["host_bytes"] == 40
    ft.deactivate()
    assert routing.active_router() is None and ft.routing_report() == []
    assert not torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.PrivateUse1)
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::convolution_overrideable", "PrivateUse1")
    # activating again routes again (the sim stays installed in the process)
    ft.init_backend("sim")
    try:
        assert routing.active_router() is not router and routing.active_router().uses_fallback
    finally:
        ft.deactivate()
