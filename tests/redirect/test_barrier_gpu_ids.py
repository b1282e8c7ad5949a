"""``dist.barrier(device_ids=...)`` when ``gpu_ids`` renumbers devices (sim with three devices,
so this module runs in a fresh interpreter of its own)."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl as ft

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_barrier_device_ids_follow_gpu_ids(monkeypatch):
    """``barrier(device_ids=[local_rank])`` (accelerate, Lightning) is a logical index; the current
    device's own index (transformers passes ``torch.accelerator.current_device_index()``) is kept.
    torch puts the barrier's one-element tensor on that device: the sim's allocators show which."""
    import torch.distributed as dist
    from flagos_torchfl.sim.runtime import state as runtime

    monkeypatch.setenv("FL_SIM_DEVICES", "3")
    monkeypatch.delenv("FL_BACKEND", raising=False)
    ft.deactivate()
    ft.init_backend("sim", gpu_ids=[2, 1])
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for index in range(3):
            runtime.allocator(index).reset_peak()
        dist.barrier(device_ids=[0])
        assert [runtime.allocator(i).max_allocated > 0 for i in range(3)] == [False, False, True]
        dist.barrier(device_ids=[1])
        assert [runtime.allocator(i).max_allocated > 0 for i in range(3)] == [False, True, True]
        runtime.allocator(1).reset_peak()
        runtime.allocator(2).reset_peak()
        dist.barrier(device_ids=[torch.accelerator.current_device_index()])  # physical 2
        assert [runtime.allocator(i).max_allocated > 0 for i in range(3)] == [False, False, True]
    finally:
        dist.destroy_process_group()
        ft.deactivate()
