"""Factories, tensor and module moves, nn layers, default-device contexts, generators, pinning."""
from __future__ import annotations

import pytest
import torch

from flagos_torchfl.redirect import DeviceOrdinalError, factories

CPU = torch.device("cpu")


def test_every_device_constructor_is_patched(monkeypatch):
    import flagos_torchfl as ft

    monkeypatch.delenv("FL_BACKEND", raising=False)
    ft.deactivate()
    places = {f: factories._owners(f) for f in factories.device_constructors()}
    assert len(places) >= 36 and all(places.values()), [f.__name__ for f, o in places.items() if not o]
    ft.init_backend("cpu")
    try:
        for original, owners in places.items():
            for owner, attr in owners:
                assert getattr(owner, attr).__wrapped__ is original
    finally:
        ft.deactivate()


@pytest.mark.parametrize("call", [
    lambda d: torch.zeros(2, device=d), lambda d: torch.ones(2, 2, device=d),
    lambda d: torch.empty(3, device=d), lambda d: torch.full((2,), 1.5, device=d),
    lambda d: torch.rand(2, device=d), lambda d: torch.randn(2, device=d),
    lambda d: torch.randint(0, 5, (2,), device=d), lambda d: torch.arange(4, device=d),
    lambda d: torch.tensor([1.0], device=d), lambda d: torch.as_tensor([1, 2], device=d),
    lambda d: torch.eye(2, device=d), lambda d: torch.linspace(0, 1, 3, device=d),
    lambda d: torch.randperm(3, device=d), lambda d: torch.fft.fftfreq(4, device=d),
    lambda d: torch.zeros_like(torch.ones(2), device=d), lambda d: torch.ones_like(torch.ones(2), device=d),
    lambda d: torch.empty_like(torch.ones(2), device=d), lambda d: torch.full_like(torch.ones(2), 3, device=d),
    lambda d: torch.rand_like(torch.ones(2), device=d), lambda d: torch.randn_like(torch.ones(2), device=d),
    lambda d: torch.randint_like(torch.ones(2), 5, device=d), lambda d: torch.normal(0.0, 1.0, (2,), device=d),
    lambda d: torch.ones(2).new_zeros(3, device=d), lambda d: torch.ones(2).new_ones(3, device=d),
    lambda d: torch.ones(2).new_empty(3, device=d), lambda d: torch.ones(2).new_full((3,), 2.0, device=d),
    lambda d: torch.ones(2).new_tensor([1.0], device=d), lambda d: torch.ones(2).new_empty_strided((2,), (1,), device=d),
    lambda d: torch.sparse_coo_tensor([[0]], [1.0], (2,), device=d, check_invariants=True),
])
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 0), torch.device("cuda"), 0])
def test_factories_take_every_spelling(cpu_backend, call, device):
    assert call(device).device == CPU


def test_factory_pin_memory_is_dropped_on_cpu(cpu_backend):
    x = torch.empty(4, pin_memory=True)
    assert not x.is_pinned() and x.device == CPU


def test_tensor_moves(cpu_backend):
    x = torch.ones(2)
    for moved in (x.cuda(), x.cuda(0), x.cuda("cuda:0"), x.cuda(device=0, non_blocking=True),
                  x.to("cuda"), x.to(0), x.to(torch.device("cuda:0")), x.to(device="cuda"),
                  x.to("cuda", torch.float16), x.to(0, non_blocking=True)):
        assert moved.device == CPU
    assert x.to("cuda", torch.float16).dtype == torch.float16
    assert x.to(torch.float64).dtype == torch.float64 and x.to(x).dtype == x.dtype
    with pytest.raises(DeviceOrdinalError, match="has 1 device"):
        x.to("cuda:1")
    with pytest.raises(DeviceOrdinalError, match="cuda:3 does not exist: backend 'cpu' has 1 device"):
        x.cuda(3)


def test_is_cuda_stays_truthful(cpu_backend):
    """Decision: Tensor.is_cuda is not patched; the usual branches still land on the target."""
    x = torch.zeros(2, device="cuda")
    assert x.is_cuda is False and x.device.type == "cpu"
    assert "is_cuda" not in vars(torch.Tensor)
    y = x if x.is_cuda else x.cuda()  # the common idiom works: .cuda() is redirected
    assert y.device == CPU


def test_module_moves_and_layer_devices(cpu_backend):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4, device="cuda"), torch.nn.LayerNorm(4, device="cuda:0"))
    for moved in (model.cuda(), model.cuda(0), model.to("cuda"), model.to(0), model.to(device="cuda:0"),
                  model.to(torch.device("cuda"), torch.float64)):
        assert {p.device for p in moved.parameters()} == {CPU}
    with torch.device("meta"):
        lazy = torch.nn.Linear(2, 2)
    lazy.to_empty(device="cuda")
    assert lazy.weight.device == CPU
    emb = torch.nn.Embedding(5, 2, device=0)
    assert emb.weight.device == CPU


def test_default_device_contexts(cpu_backend):
    with torch.device("cuda"):
        assert torch.zeros(1).device == CPU
        assert torch.nn.Linear(2, 2).weight.device == CPU
    torch.set_default_device("cuda:0")
    try:
        assert torch.arange(3).device == CPU
    finally:
        torch.set_default_device(None)


@pytest.mark.torch_feature("get_default_device")
def test_the_default_device_reads_back_as_the_backends(cpu_backend):
    torch.set_default_device("cuda:0")
    try:
        assert torch.get_default_device() == CPU
    finally:
        torch.set_default_device(None)


def test_generator(cpu_backend):
    g = torch.Generator("cuda")
    g2 = torch.Generator(device="cuda:0")
    assert g.device == CPU and g2.device == CPU
    assert isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    g.manual_seed(3)
    a = torch.rand(3, generator=g, device="cuda")
    g.manual_seed(3)
    assert torch.equal(a, torch.rand(3, generator=g))


def test_pinning_on_cpu(cpu_backend):
    x = torch.ones(3)
    assert x.pin_memory() is x
    data = torch.utils.data.TensorDataset(torch.arange(6.0))
    loader = torch.utils.data.DataLoader(data, batch_size=3, pin_memory=True, pin_memory_device="cuda")
    assert loader.pin_memory is False
    assert [b[0].tolist() for b in loader] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    positional = torch.utils.data.DataLoader(data, 3, False, None, None, 0, None, True)
    assert positional.pin_memory is False and positional.batch_size == 3


def test_two_logical_devices(two_cpu_devices):
    x = torch.ones(2)
    assert x.to("cuda:1").device == CPU and torch.zeros(1, device=1).device == CPU
    assert torch.cuda.device_count() == 2
    with pytest.raises(DeviceOrdinalError, match="has 2 device"):
        x.to("cuda:2")


def test_legacy_types(cpu_backend):
    x = torch.cuda.FloatTensor(2, 3)
    assert x.shape == (2, 3) and x.dtype == torch.float32 and x.device == CPU
    assert isinstance(torch.zeros(1), torch.cuda.FloatTensor)
    assert not isinstance(torch.zeros(1, dtype=torch.int64), torch.cuda.FloatTensor)
    assert torch.cuda.LongTensor([1, 2]).dtype == torch.int64
    y = torch.zeros(2, dtype=torch.int64)
    assert y.type(torch.cuda.FloatTensor).dtype == torch.float32
    assert y.type("torch.cuda.HalfTensor").dtype == torch.float16
    assert y.type() == "torch.LongTensor" and y.type(torch.float64).dtype == torch.float64
