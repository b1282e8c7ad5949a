"""The sim's patches of torch go through the one recorder (``patching.Patcher``): applied in
``PATCHES``' order, a patch that fails leaves torch as it was, they outlast ``ft.deactivate()``
(sim tensors must keep working), and ``torch_patches.undo()`` restores torch exactly."""
from __future__ import annotations

import os

import pytest
import torch
import torch.autograd.variable

import flagos_torchfl as ft
from flagos_torchfl import compat

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
if not compat.has("python_privateuse1_backend"):  # the sim's floor: nothing here can import
    pytest.skip(compat.sim_floor_reason(torch.__version__), allow_module_level=True)
from flagos_torchfl.sim.integration import torch_patches  # noqa: E402


def _torch_state() -> dict:
    """What the sim's patches may change, by identity."""
    storage = torch.UntypedStorage
    return {
        "Generator": torch.Generator,
        "storage.__new__": vars(storage).get("__new__"),
        "storage.new": vars(storage).get("new"),
        "storage.resize_": vars(storage).get("resize_"),
        "record_stream": vars(torch.Tensor).get("record_stream"),
        "engine": torch.autograd.variable.Variable._execution_engine,
        **{f"accelerator.{name}": getattr(torch.accelerator, name, None)
           for name in ("synchronize", "current_device_index", "memory_allocated", "empty_cache")},
    }


BEFORE = _torch_state()


def test_a_patch_that_fails_leaves_torch_as_it_was(monkeypatch):
    def broken(needs, patcher):
        raise RuntimeError("injected")

    monkeypatch.setattr(torch_patches, "PATCHES",
                        torch_patches.PATCHES[:3] + (("broken", lambda needs: True, broken),))
    with pytest.raises(RuntimeError, match="injected"):
        torch_patches.apply(num_devices=2, cpp=False)
    assert _torch_state() == BEFORE
    assert torch_patches.applied() == []


def test_installing_applies_them_in_order_and_deactivate_leaves_them():
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ.update(FL_SIM_RUNTIME="python", FL_SIM_DEVICES="2")
    ft.init_backend("sim")
    names = [name for name, _, _ in torch_patches.PATCHES]
    assert torch_patches.applied() == names  # the Python guard, two devices: every one of them
    x = torch.ones(3, device="sim:1")
    ft.deactivate()
    assert torch.Generator("sim:1").device == torch.device("sim:1")
    assert torch.UntypedStorage(8, device="sim:1").device == torch.device("sim:1")
    assert (x + 1).sum().item() == 6


def test_undo_restores_torch_exactly():
    torch_patches.undo()
    assert _torch_state() == BEFORE
    assert torch_patches.applied() == []
