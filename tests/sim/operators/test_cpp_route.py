"""The C++ route (``FL_SIM_RUNTIME=cpp``, with the CUDA-like native set ``device_kernel_ops``): the
sim's native operators run through one boxed C++ kernel, which promises what the Python kernels
promise (:mod:`tests.sim.operators.route_cases`), and the device's memory is registered in C++
(the PrivateUse1 allocator, the pinned host allocator)."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl.sim as fsim
from flagos_torchfl.sim.runtime import tensors
from tests.sim.operators.route_cases import *  # noqa: F401,F403  (the shared cases run on this runtime)
from tests.sim.operators.route_cases import installed_sim

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def sim():
    return installed_sim("cpp")


def test_native_operators_have_the_cpp_kernel_and_random_ones_the_python_kernel(sim):
    dump = torch._C._dispatch_dump("aten::add.Tensor")
    assert "PrivateUse1" in dump and "runtime.cpp" in dump.split("PrivateUse1", 1)[1].splitlines()[0]
    random = torch._C._dispatch_dump("aten::normal_")
    assert "runtime.cpp" not in random.split("PrivateUse1", 1)[1].splitlines()[0]


def test_a_non_blocking_copy_to_the_host_is_pinned_and_the_host_cache_empties(sim):
    host = torch.randn(100, device="sim").to("cpu", non_blocking=True)
    assert host.is_pinned()
    torch.accelerator.empty_host_cache()  # killed the process (SIGSEGV) without a host allocator
    assert host.sum().isfinite()
    assert not torch.randn(4, device="sim").to("cpu").is_pinned()


def test_the_device_allocator_answers_torch_accelerator(sim):
    x = torch.ones(256, device="sim:0")
    assert torch._C._accelerator_isAllocatorInitialized()
    assert torch.accelerator.memory_allocated(0) == sim.memory_allocated(0) >= 1024
    assert torch.accelerator.memory_stats(0)["allocated_bytes.all.current"] == sim.memory_allocated(0)
    torch.accelerator.reset_peak_memory_stats(0)
    assert torch.accelerator.max_memory_allocated(0) == sim.memory_allocated(0)
    del x
    torch.accelerator.empty_cache()
    assert sim.memory_reserved(0) == 0 or sim.memory_reserved(0) >= sim.memory_allocated(0)


def test_an_out_of_memory_error_is_torchs(sim):
    fsim.set_memory_limit(1 << 20)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.ones(1 << 19, device="sim") + 1
    finally:
        fsim.set_memory_limit(None)


def test_storage_resize_keeps_the_leading_bytes(sim):
    t = torch.arange(4.0, device="sim")
    storage = t.untyped_storage()
    storage.resize_(64)
    assert storage.nbytes() == 64
    assert torch.tensor([], device="sim").set_(storage, 0, (4,), (1,)).cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_sim_backend_counts_every_cpp_kernel_call_for_the_verdict(sim):
    """The routing census's count of native calls (``Backend.count_native_calls``) has the C++
    kernels' calls, counted in C++, but for those a thread makes inside a route (paused)."""
    from flagos_torchfl.backends import get_backend

    x = torch.ones(4, device="sim")
    x.add(x)  # before counting: not counted
    count = get_backend("sim").count_native_calls()
    try:
        for _ in range(3):
            x.add(x)
        count.pause(True)
        x.add(x)  # inside a route: the route's work
        count.pause(False)
        x.mul(x)
    finally:
        count.stop()
    x.add(x)  # stopped: not counted
    rows = count.rows()
    assert rows["aten::add.Tensor"][0] == 3 and rows["aten::add.Tensor"][1] > 0
    assert rows["aten::mul.Tensor"][0] == 1
    again = get_backend("sim").count_native_calls()  # a new count starts from zero
    again.stop()
    assert "aten::add.Tensor" not in again.rows()


@pytest.mark.parametrize("causal, masked", [(True, False), (False, False), (False, True)])
def test_attention_chooses_and_runs_the_hosts_fused_kernel(sim, causal, masked):
    """With the host's flash attention in the native set, ``scaled_dot_product_attention``
    chooses its kernel as the CPU does and runs it natively: forward and backward equal the CPU's
    bit for bit (the math composite rounds differently)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 16, requires_grad=True) for _ in range(3))
    mask = torch.rand(8, 8) > 0.3 if masked else None
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    expected.sum().backward()
    on_sim = [t.detach().to("sim").requires_grad_() for t in (q, k, v)]
    with torch.profiler.profile() as prof:
        out = torch.nn.functional.scaled_dot_product_attention(
            *on_sim, attn_mask=None if mask is None else mask.to("sim"), is_causal=causal)
        out.sum().backward()
    ran = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ran
    assert "aten::_scaled_dot_product_attention_math" not in ran
    assert torch.equal(out.cpu(), expected)
    for mine, theirs in zip(on_sim, (q, k, v)):
        assert torch.equal(mine.grad.cpu(), theirs.grad)


def test_attention_keeps_the_programs_choice_of_kernel(sim):
    """``sdpa_kernel`` is obeyed as on the CPU: math alone runs the math composite, no kernel at
    all is refused."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 3, 8, 16, device="sim")
    with sdpa_kernel(SDPBackend.MATH), torch.profiler.profile() as prof:
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert "aten::_scaled_dot_product_attention_math" in {e.key for e in prof.key_averages()}
    with sdpa_kernel([]), pytest.raises(RuntimeError, match="No viable backend"):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)


def test_a_python_number_is_cast_in_host_memory_not_device_memory(sim):
    """TensorIterator casts a Python number to the operands' dtype in a temporary: the CPU kernel
    makes it in host memory (one device allocation of 4-6 µs each before, per ``x.add_(1)``)."""
    x = torch.ones(8, 8, device="sim")
    before = sim.memory_stats(0)["allocation.all.allocated"]
    x.add_(1)
    x.mul_(0.5)
    assert sim.memory_stats(0)["allocation.all.allocated"] == before
    assert torch.equal(x.cpu(), torch.ones(8, 8))


@pytest.mark.parametrize("make", [
    lambda x: x.sum(),
    lambda x: x[:2] * 3,
    lambda x: torch.sum(x, 0, out=torch.empty(0, device=x.device)),
    lambda x: x.reshape(2, 4).sum(0, keepdim=True)[:, 1:3].clone(),
], ids=["reduction", "two-elements", "out-grown", "clone-of-a-view"])
def test_a_small_result_is_device_memory_of_its_own(sim, make):
    """A result of at most 16 bytes, which the CPU kernel makes in host memory, is copied to a
    block of the device: counted in its memory, freed back to it."""
    x = torch.arange(8.0, device="sim")
    before = sim.memory_allocated(0)
    result = make(x)
    assert result.device.type == "sim" and tensors.owns_block(result.untyped_storage())
    assert sim.memory_allocated(0) == before + 512
    assert torch.equal(result.cpu(), make(torch.arange(8.0)))
    del result
    assert sim.memory_allocated(0) == before
