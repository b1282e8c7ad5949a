"""FSDP1 ``device_id`` as CUDA code passes it (``torch.cuda.current_device()``, ``"cuda:0"``,
``torch.device("cuda", 0)``) on the cpu backend, in one process with a one-rank group: FSDP1 takes
the backend's device. Its construction runs on every supported torch; training FSDP1 on CPU
tensors needs a torch whose FSDP1 can (compat ``fsdp_cpu``; the client fsdp1_device_id of
tests/e2e/test_distributed_clients.py)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import flagos_torchfl as ft

DEVICE_IDS = {"current_device": lambda: torch.cuda.current_device(), "cuda:0": lambda: "cuda:0",
              "torch.device": lambda: torch.device("cuda", 0)}


@pytest.fixture
def cpu_backend(monkeypatch):
    monkeypatch.delenv("FL_BACKEND", raising=False)
    ft.deactivate()
    ft.init_backend("cpu")
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        ft.deactivate()


@pytest.mark.parametrize("device_id", list(DEVICE_IDS))
def test_fsdp1_takes_the_backends_device_for_a_cuda_device_id(cpu_backend, device_id):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    inner = nn.Linear(4, 2)
    expected = [p.detach().clone() for p in inner.parameters()]
    model = FSDP(inner, device_id=DEVICE_IDS[device_id](), use_orig_params=True)
    assert model.compute_device == torch.device("cpu")
    assert [p.device.type for p in model.parameters()] == ["cpu", "cpu"]
    # one rank: each parameter is whole (a view into FSDP1's flat parameter), the values kept
    assert all(torch.equal(p, e) for p, e in zip(model.parameters(), expected))


def test_fsdp1_is_torchs_own_after_deactivation(cpu_backend):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    assert hasattr(FSDP.__init__, "__wrapped__")  # patched: this test imported FSDP under activation
    ft.deactivate()
    assert not hasattr(FSDP.__init__, "__wrapped__")
    ft.init_backend("cpu")
