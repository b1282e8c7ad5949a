"""The cases of the CUDA entry points beyond devices and factories on the simulated accelerator:
streams and events, storages, stream handles, the per-process memory share and raw allocations,
attention's backend switches and FlexAttention, each as CUDA gives them. The test modules that
import them (plain sim, a chip profile) run in fresh interpreters: PrivateUse1 is claimed once
per process. A module's ``PROFILE`` names the sim profile (None: the plain sim)."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import flagos_torchfl as ft


@pytest.fixture(scope="module")
def sim(request):
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ.update(FL_SIM_DEVICES="2", FL_SIM_DEVICE_MEMORY="64MiB")
    if request.module.PROFILE:
        os.environ["FL_SIM_PROFILE"] = request.module.PROFILE
    selection = ft.init_backend("sim")
    yield selection
    ft.deactivate()


def test_device_generic_streams_and_events_made_for_cuda_are_the_chips(sim):
    own = sim.device_type
    stream = torch.Stream(device="cuda:1")
    event = torch.Event(device="cuda", enable_timing=True)
    assert stream.device == torch.device(own, 1)
    assert isinstance(stream, torch.Stream) and isinstance(event, torch.Event)
    event.record(torch.Stream(device="cuda"))
    event.synchronize()
    assert event.query()


def test_storages_copy_to_the_chip(sim):
    data = torch.arange(6.0)
    moved = data.untyped_storage().cuda()
    assert moved.device == torch.device(sim.device_type, 0) and moved.nbytes() == 24
    assert data.untyped_storage().to(device="cuda:1").device.index == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage's deprecation
        assert data.storage().cuda().tolist() == data.tolist()
    back = torch.tensor([], device="cuda").set_(moved).view(torch.float32).cpu()
    assert torch.equal(back, data)


def test_streams_carry_an_integer_handle_and_stay_the_same_stream(sim):
    current = torch.cuda.current_stream()
    assert current.cuda_stream == 0 and current == torch.cuda.default_stream()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        inside = torch.cuda.current_stream()
        assert inside == side and inside.cuda_stream == side.stream_id != 0
    assert isinstance(inside, torch.Stream)


def test_the_memory_share_of_the_process_caps_the_chips_pool(sim):
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.25, device=0)
    try:
        with pytest.raises(torch.OutOfMemoryError, match="set_per_process_memory_fraction"):
            torch.empty(total // 2, dtype=torch.uint8, device="cuda")
        kept = torch.empty(total // 8, dtype=torch.uint8, device="cuda")
        del kept
        with pytest.raises(ValueError, match="0~1"):
            torch.cuda.set_per_process_memory_fraction(1.5)
        with pytest.raises(TypeError, match="float"):
            torch.cuda.set_per_process_memory_fraction(1)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device=0)
    torch.empty(total // 2, dtype=torch.uint8, device="cuda")


def test_raw_allocations_come_from_the_chips_pool(sim):
    before = torch.cuda.memory_allocated()
    pointer = torch.cuda.caching_allocator_alloc(1 << 16)
    assert pointer != 0 and torch.cuda.memory_allocated() == before + (1 << 16)
    torch.cuda.caching_allocator_delete(pointer)
    assert torch.cuda.memory_allocated() == before
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.cuda.caching_allocator_delete(pointer)


def test_attention_with_every_backend_disabled_is_refused_as_on_a_device(sim):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 4, 8, device="cuda", requires_grad=True)
    with sdpa_kernel([]), pytest.raises(RuntimeError, match="No viable backend"):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    with sdpa_kernel([SDPBackend.MATH]):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    out.sum().backward()
    host = q.detach().cpu().requires_grad_()
    expected = torch.nn.functional.scaled_dot_product_attention(host, host, host, is_causal=True)
    expected.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), expected.detach())
    torch.testing.assert_close(q.grad.cpu(), host.grad)


def test_flex_attention_runs_on_the_chip_as_on_cuda(sim):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    q = torch.randn(1, 2, 128, 16, device="cuda", requires_grad=True)
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 1, 128, 128, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = flex_attention(q, q, q, block_mask=mask)
    host = q.detach().cpu()
    expected = torch.nn.functional.scaled_dot_product_attention(host, host, host, is_causal=True)
    torch.testing.assert_close(out.detach().cpu(), expected)
    out.sum().backward()  # a device's FlexAttention has a backward (the CPU's has none)
    assert q.grad.device.type == sim.device_type


def test_lazy_modules_move_to_the_chip(sim):
    lazy = torch.nn.LazyLinear(4).cuda()
    assert lazy(torch.randn(2, 3, device="cuda")).device.type == sim.device_type
    assert lazy.weight.device.type == sim.device_type
