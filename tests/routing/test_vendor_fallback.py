"""A vendor plugin already holds PrivateUse1's one backend fallback: routing keeps it and adds
per-operator kernels only where it has a better route (a library or a composite)."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]

seen = []


def vendor_fallback(op, *args, **kwargs):
    seen.append(op.name())
    raise NotImplementedError(f"vendor plugin: {op.name()} is not implemented")


@pytest.fixture(scope="module")
def router():
    from flagos_torchfl import routing, sim
    from flagos_torchfl.machine import activation
    from flagos_torchfl.selection import build_selection

    selection = build_selection("sim", {})
    activation.activate(selection.chip, selection)
    assert sim.is_installed()
    vendor = torch.library.Library("_", "IMPL")
    vendor.fallback(vendor_fallback, "PrivateUse1")
    undo = routing.activate(selection)
    yield routing.active_router()
    undo()
    vendor._destroy()


def test_the_vendor_fallback_is_kept(router):
    assert not router.uses_fallback
    assert torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.PrivateUse1)
    assert "aten::silu.out" in router.registered  # has a decomposition
    assert "aten::histc" not in router.registered  # nothing better than the vendor's fallback


def test_composites_run_and_the_rest_reaches_the_vendor(router):
    x = torch.randn(8)
    dx = x.to("sim")
    torch.testing.assert_close(torch.nn.functional.silu(dx).cpu(), torch.nn.functional.silu(x))
    assert "aten::silu.out" not in seen
    with pytest.raises(NotImplementedError, match="vendor plugin: aten::histc"):
        torch.histc(dx, bins=4)
    assert seen == ["aten::histc"]
