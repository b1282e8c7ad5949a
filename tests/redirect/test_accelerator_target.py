"""The facade on an accelerator-like backend: logical cuda:i reaches the backend's device
module as physical index devices[i]. The device module here is a recording stand-in (the
selection's device module is all the redirect layer sees of a chip); tensors go to ``meta``."""
from __future__ import annotations

import types

import pytest
import torch

from flagos_torchfl import compat

from flagos_torchfl import redirect
from flagos_torchfl.errors import UnsupportedFeatureError
from flagos_torchfl.redirect import Target
from tests.helpers import chip as make_chip


class ChipModule:
    """A device module with the functions a vendor plugin's ``torch.<chip>`` provides."""

    def __init__(self):
        self.calls = []
        self.default_generators = {1: torch.Generator(), 3: torch.Generator()}
        self.amp = types.SimpleNamespace(GradScaler=type("ChipGradScaler", (), {}))

    def __getattr__(self, name):
        if name in {"set_device", "get_device_name", "synchronize", "memory_allocated",
                    "utilization", "mem_get_info", "get_device_capability", "empty_cache"}:
            def call(*args):
                self.calls.append((name, args))
                return {"get_device_name": "chip", "mem_get_info": (1, 2),
                        "get_device_capability": (9, 1)}.get(name, 0)
            return call
        raise AttributeError(name)


@pytest.fixture
def chip():
    module = ChipModule()
    undo = redirect.apply(Target(make_chip("fakechip", "meta", "float16", "hccl"), (3, 1), module))
    yield module
    undo()


def test_logical_indices_reach_the_module_as_physical(chip):
    cuda = torch.cuda
    cuda.set_device(1)
    assert cuda.current_device() == 1 and chip.calls[-1] == ("set_device", (1,))
    cuda.set_device(0)
    assert chip.calls[-1] == ("set_device", (3,))
    assert cuda.get_device_name(1) == "chip" and chip.calls[-1] == ("get_device_name", (1,))
    cuda.synchronize()
    assert chip.calls[-1] == ("synchronize", (3,))
    cuda.memory_allocated("cuda:1")
    assert chip.calls[-1] == ("memory_allocated", (1,))
    assert cuda.mem_get_info(0) == (1, 2)
    # the CUDA capability whose features the chip serves, not the module's own (9, 1): a float16
    # chip without is_bf16_supported() computes no bfloat16
    assert cuda.get_device_capability() == (7, 0)
    assert cuda.utilization() == 0  # not in the table, but the module has it
    with pytest.raises(UnsupportedFeatureError, match="torch.cuda.CUDAGraph .*'fakechip'"):
        cuda.CUDAGraph()
    assert cuda.default_generators == (chip.default_generators[3], chip.default_generators[1])
    assert cuda.is_bf16_supported() is False  # declares float16


def test_tensors_go_to_the_chip_type(chip):
    assert torch.zeros(1, device="cuda:1").device.type == "meta"
    assert torch.ones(1).to(0).device.type == "meta"


def test_the_cuda_grad_scaler_is_the_chips(chip):
    if compat.has("amp_grad_scaler"):  # the device-generic scaler takes the chip's device type
        assert torch.amp.GradScaler("cuda", enabled=False)._device == "meta"
    else:  # CUDA's is the only one: the chip's own scaler (torch-npu 2.1's torch.npu.amp) stands in
        assert torch.cuda.amp.GradScaler is chip.amp.GradScaler
