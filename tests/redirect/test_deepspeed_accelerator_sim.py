"""DeepSpeed's accelerator on the sim (a module of its own process: the sim claims PrivateUse1):
imported after activation, ``get_accelerator()`` is the package's, installed through DeepSpeed's
``set_accelerator`` the moment ``deepspeed.accelerator`` is imported, and answers for the sim's
logical devices; deactivation gives DeepSpeed back its own detection."""
from __future__ import annotations

import sys

import pytest
import torch

import flagos_torchfl as ft
from tests.e2e.realclients import requires

pytestmark = [pytest.mark.isolated, requires("deepspeed")]


@pytest.fixture(scope="module")
def accelerator():
    import os

    os.environ["FL_SIM_DEVICES"] = "2"
    os.environ["FL_BACKEND"] = "sim"
    ft.deactivate()
    ft.auto_select_backend()
    assert "deepspeed" not in sys.modules  # the patch waits for the program's import
    from deepspeed.accelerator import get_accelerator

    yield get_accelerator()
    ft.deactivate()


def test_devices_are_the_sims(accelerator):
    assert type(accelerator).__name__ == "BackendAccelerator" and accelerator.is_available()
    assert accelerator.device_name() == "sim" and accelerator.device_name(1) == "sim:1"
    assert accelerator.device_count() == torch.cuda.device_count() == 2
    accelerator.set_device(1)
    assert accelerator.current_device() == torch.cuda.current_device() == 1
    assert accelerator.current_device_name() == "sim:1"
    # DeepSpeed moves tensors with tensor.to(accelerator.device_name()): the current device
    assert torch.ones(2).to(accelerator.device_name()).device == torch.device("sim", 1)
    assert accelerator.FloatTensor([1.0, 2.0]).device == torch.device("sim", 1)
    assert accelerator.on_accelerator(torch.ones(1, device="cuda")) and not accelerator.on_accelerator(torch.ones(1))
    accelerator.set_device(0)


def test_collective_dtypes_and_pinning(accelerator):
    assert accelerator.communication_backend_name() == "simccl"
    assert accelerator.is_bf16_supported() and accelerator.is_fp16_supported()
    assert set(accelerator.supported_dtypes()) == {torch.float32, torch.float16, torch.bfloat16}
    assert accelerator.pin_memory(torch.ones(3)).is_pinned()
    assert accelerator.pin_memory(torch.ones(3), make_copy=False).is_pinned()


def test_memory_statistics_follow_the_sim_allocator(accelerator):
    accelerator.empty_cache()
    before = accelerator.memory_allocated(0)
    block = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:0")
    assert accelerator.memory_allocated(0) - before == torch.sim.memory_allocated(0) - before >= 1 << 20
    assert accelerator.memory_stats(0)["allocated_bytes.all.current"] == torch.sim.memory_allocated(0)
    assert accelerator.max_memory_allocated(0) >= accelerator.memory_allocated(0)
    assert accelerator.total_memory(0) == torch.sim.get_device_properties(0).total_memory
    del block


def test_rng_streams_and_events(accelerator):
    accelerator.manual_seed(5)
    state = accelerator.get_rng_state()
    first = torch.rand(3, device="cuda").cpu()
    accelerator.set_rng_state(state)
    assert torch.equal(first, torch.rand(3, device="cuda").cpu())
    assert accelerator.initial_seed() == 5
    stream = accelerator.Stream()
    with accelerator.stream(stream):
        assert accelerator.current_stream() == stream
    start, end = accelerator.Event(enable_timing=True), accelerator.Event(enable_timing=True)
    start.record()
    torch.ones(64, device="cuda").sum()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0


def test_deactivate_gives_deepspeed_its_own_detection(accelerator):
    import deepspeed.accelerator.real_accelerator as real

    ft.deactivate()
    assert real.ds_accelerator is None  # nothing chosen yet when the patch installed its own
    ft.auto_select_backend()  # deepspeed now imported: applied at activation
    assert type(real.get_accelerator()).__name__ == "BackendAccelerator"
