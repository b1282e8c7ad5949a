"""Installing the sim when another backend (here a stand-in for torch_npu) holds PrivateUse1."""
from __future__ import annotations

import sys
import types

import pytest
import torch

import flagos_torchfl.sim as fsim
from flagos_torchfl.errors import PrivateUse1ClaimedError

pytestmark = pytest.mark.isolated


def test_a_renamed_privateuse1_is_named_with_its_vendor():
    # what importing torch_npu does: rename the slot and register its device module
    vendor = types.ModuleType("torch_npu")
    device_module = types.ModuleType("torch_npu.npu")
    device_module.is_available = lambda: True
    sys.modules["torch_npu"] = vendor
    torch.utils.rename_privateuse1_backend("npu")
    torch._register_device_module("npu", device_module)
    with pytest.raises(PrivateUse1ClaimedError) as info:
        fsim.install()
    assert "'npu'" in str(info.value) and "torch_npu" in str(info.value)
    assert not fsim.is_installed()
    assert torch._C._get_privateuse1_backend_name() == "npu"
