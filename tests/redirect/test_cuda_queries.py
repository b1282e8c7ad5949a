"""The questions CUDA code asks before it picks a path, on the cpu backend: they answer for the
chip (docs/design.md, "What CUDA code asks before it picks a path"), and an action the chip cannot
do raises the package's error. The sim's and the profiles' answers: tests/profiles."""
from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import flagos_torchfl as ft
from flagos_torchfl.errors import UnsupportedFeatureError


def test_nccl_is_available_where_the_chip_s_library_serves_it(cpu_backend):
    plain = c10d.is_nccl_available()  # torch's own function: its internals ask it
    assert dist.is_nccl_available() is True and dist.is_backend_available("nccl") is True
    assert dist.is_backend_available("gloo") is True and dist.is_backend_available("nosuch") is False
    assert ("nccl" if dist.is_nccl_available() else "gloo") == "nccl"
    ft.deactivate()
    assert dist.is_nccl_available() is plain is c10d.is_nccl_available()
    assert dist.is_nccl_available is c10d.is_nccl_available


def test_the_idiom_s_process_group_is_the_chip_s(cpu_backend):
    dist.init_process_group("nccl" if dist.is_nccl_available() else "gloo", store=dist.HashStore(),
                            rank=0, world_size=1)
    try:
        total = torch.ones(2, device="cuda")
        dist.all_reduce(total)
        assert dist.get_backend() == "gloo" and total.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_capability_and_dtype_queries_answer(cpu_backend):
    cuda = torch.cuda
    assert cuda.is_bf16_supported() and cuda.get_device_capability() == (8, 0)
    assert cuda.get_device_capability() >= (8, 0)  # the gate bfloat16 code asks, as on Ampere
    assert cuda.is_tf32_supported() is False
    assert cuda.get_arch_list() == [] and cuda.get_gencode_flags() == ""


def test_nccl_s_own_queries_answer_and_its_collectives_raise(cpu_backend):
    nccl = torch.cuda.nccl
    assert nccl.version() == (0, 0, 0) and nccl.version() < (2, 10)  # no NCCL: its gates stay closed
    assert nccl.is_available([torch.ones(1, device="cuda")]) is True
    assert nccl.is_available(torch.ones(1, device="meta")) is False
    with pytest.raises(UnsupportedFeatureError, match="torch.cuda.nccl.all_reduce is not available on backend 'cpu'"):
        nccl.all_reduce([torch.ones(1)])
    with pytest.raises(AttributeError, match="has no attribute 'all_reduse'"):
        nccl.all_reduse


class VendorModule:
    """What the vendors' device modules answer (sources: data/chip_models.json): torch_npu's
    ``get_device_capability()`` is None and its properties' major/minor None; torch_mlu's is its
    architecture's, (3, 7) on an MLU370; torch_musa has ``is_tf32_supported``."""

    def __init__(self, bf16, capability, tf32=None):
        self.is_bf16_supported = lambda: bf16
        self.get_device_capability = lambda index=None: capability
        self.get_device_properties = lambda index=None: types.SimpleNamespace(
            name="chip", total_memory=1 << 30, major=capability and capability[0], minor=capability and capability[1])
        if tf32 is not None:
            self.is_tf32_supported = lambda: tf32


@pytest.mark.parametrize("chip, module, capability, tf32", [
    ("ascend", VendorModule(True, None), (8, 0), False),  # torch_npu on a 910B
    ("ascend", VendorModule(False, None), (7, 0), False),  # torch_npu on a 910A
    ("cambricon", VendorModule(False, (3, 7)), (7, 0), False),  # torch_mlu on an MLU370
    ("mthreads", VendorModule(True, (2, 2), tf32=True), (8, 0), True),  # torch_musa on an S4000
], ids=["torch_npu-910b", "torch_npu-910a", "torch_mlu-mlu370", "torch_musa-s4000"])
def test_the_real_vendor_backends_answer_with_their_module_s_bfloat16(chip, module, capability, tf32):
    from flagos_torchfl import redirect
    from flagos_torchfl.backends import registry
    from flagos_torchfl.redirect import Target

    backend = type("Chip", (type(registry().get(chip)),), {"device_type": "meta"})()  # tensors need a device
    undo = redirect.apply(Target(backend, (0,), module))
    try:
        cuda = torch.cuda
        assert cuda.get_device_capability() == capability
        assert (cuda.get_device_properties(0).major, cuda.get_device_properties(0).minor) == capability
        assert cuda.is_tf32_supported() is tf32 and cuda.get_arch_list() == []
        assert cuda.is_bf16_supported() is (capability >= (8, 0))
    finally:
        undo()
