"""Quantized tensors on the sim compute what they compute on the CPU: made empty, quantized per
tensor and per channel, dequantized, read back as integers, viewed, moved between host and
device; the quantized dtypes are CUDA's, and the sim's sparse and quantized kernels are
registered at the first call that needs them."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl.aten.dispatcher import has_backend_fallback, has_kernel, with_kernel

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]

KEYS = ("SparsePrivateUse1", "SparseCsrPrivateUse1", "QuantizedPrivateUse1")


@pytest.fixture(scope="module")
def sim():
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ["FL_SIM_RUNTIME"] = "cpp"  # PyTorch allocates quantized tensors with the C++ allocator
    warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
    ft.init_backend("sim")
    # what activation registered, before any sparse or quantized tensor exists
    at_start = {key: [n for n in ("aten::int_repr", "aten::_nnz", "aten::add.Tensor") if has_kernel(n, key)]
                for key in KEYS}
    yield at_start
    ft.deactivate()


def test_kernels_are_registered_at_their_first_use(sim):
    assert sim == {key: [] for key in KEYS}
    assert all(has_backend_fallback(key) for key in KEYS)
    torch.quantize_per_tensor(torch.ones(2, device="sim"), 0.5, 0, torch.quint8).int_repr()
    served = with_kernel("QuantizedCPU")
    assert all(has_kernel(n, "QuantizedPrivateUse1") for n in served)
    torch.ones(2, 2, device="sim").to_sparse().coalesce()
    assert all(has_kernel(n, "SparsePrivateUse1") for n in with_kernel("SparseCPU"))


def test_empty_affine_quantized(sim):
    q = torch._empty_affine_quantized([2], scale=2, zero_point=3, dtype=torch.quint8, device="sim")
    assert q.device == torch.device("sim", 0) and q.is_quantized and q.dtype == torch.quint8
    assert (q.q_scale(), q.q_zero_point(), q.qscheme()) == (2.0, 3, torch.per_tensor_affine)
    assert q.shape == (2,)


@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8, torch.qint32])
def test_per_tensor_quantization_computes_as_on_the_cpu(sim, dtype):
    x = torch.linspace(-3, 3, 12).reshape(3, 4)
    on_cpu = torch.quantize_per_tensor(x, 0.1, 2, dtype)
    on_sim = torch.quantize_per_tensor(x.to("sim"), 0.1, 2, dtype)
    assert on_sim.device.type == "sim" and on_sim.dtype == dtype
    assert (on_sim.q_scale(), on_sim.q_zero_point()) == (on_cpu.q_scale(), on_cpu.q_zero_point())
    assert on_sim.int_repr().device.type == "sim"
    assert torch.equal(on_sim.int_repr().cpu(), on_cpu.int_repr())
    assert torch.equal(on_sim.dequantize().cpu(), on_cpu.dequantize())
    assert torch.equal(torch.relu(on_sim).int_repr().cpu(), torch.relu(on_cpu).int_repr())
    assert torch.equal(on_sim[1:, ::2].int_repr().cpu(), on_cpu[1:, ::2].int_repr())
    assert torch.equal(on_sim.view(4, 3).int_repr().cpu(), on_cpu.view(4, 3).int_repr())
    assert torch.equal(on_sim.flip(0).int_repr().cpu(), on_cpu.flip(0).int_repr())


def test_per_channel_quantization_computes_as_on_the_cpu(sim):
    w = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    scales, zero_points = torch.tensor([0.1, 0.05, 0.2]), torch.tensor([0, 3, -2])
    on_cpu = torch.quantize_per_channel(w, scales, zero_points, 0, torch.qint8)
    on_sim = torch.quantize_per_channel(w.to("sim"), scales.to("sim"), zero_points.to("sim"), 0, torch.qint8)
    assert on_sim.device.type == "sim" and on_sim.qscheme() == torch.per_channel_affine
    assert on_sim.q_per_channel_axis() == 0
    assert torch.equal(on_sim.q_per_channel_scales().cpu(), on_cpu.q_per_channel_scales())
    assert torch.equal(on_sim.q_per_channel_zero_points().cpu(), on_cpu.q_per_channel_zero_points())
    assert torch.equal(on_sim.int_repr().cpu(), on_cpu.int_repr())
    assert torch.equal(on_sim.dequantize().cpu(), on_cpu.dequantize())


def test_copies_between_host_and_device_keep_bytes_and_quantizer(sim):
    on_cpu = torch.quantize_per_tensor(torch.arange(-4.0, 4.0), 0.25, 1, torch.qint8)
    moved = on_cpu.to("sim")
    assert moved.device.type == "sim" and (moved.q_scale(), moved.q_zero_point()) == (0.25, 1)
    back = moved.cpu()
    assert back.device.type == "cpu" and torch.equal(back.int_repr(), on_cpu.int_repr())
    assert torch.equal(moved.clone().int_repr().cpu(), on_cpu.int_repr())
    per_channel = torch.quantize_per_channel(torch.ones(2, 3), torch.tensor([0.5, 0.25]),
                                             torch.tensor([0, 1]), 0, torch.quint8)
    assert torch.equal(per_channel.to("sim").cpu().dequantize(), per_channel.dequantize())


def test_sub_byte_dtypes_are_refused_as_cuda_has_none(sim):
    with pytest.raises(RuntimeError, match=r"torch.quint4x2 is not supported.*torch.quint8, torch.qint8, torch.qint32"):
        torch.quantize_per_tensor(torch.ones(4, device="sim"), 0.5, 0, torch.quint4x2)


def test_an_overload_without_a_quantized_cpu_kernel_is_refused_as_the_dispatcher_refuses(sim):
    q = torch.quantize_per_tensor(torch.ones(4), 0.5, 0, torch.quint8)
    with pytest.raises(NotImplementedError) as on_cpu:
        torch.exp(q)
    with pytest.raises(NotImplementedError) as on_sim:
        torch.exp(q.to("sim"))
    first = str(on_sim.value).split(". ")[0]
    assert first == "Could not run 'aten::exp.out' with arguments from the 'Quantizedsim' backend"
    assert first == str(on_cpu.value).split(". ")[0].replace("QuantizedCPU", "Quantizedsim")
