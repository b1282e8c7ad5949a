"""CUDA-written code on the simulated accelerator ``sim`` (PrivateUse1, so this module runs in a
fresh interpreter of its own: registering it cannot be undone)."""
from __future__ import annotations

import io

import pytest
import torch

import flagos_torchfl as ft

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


def test_training_step_lands_on_sim(sim_backend):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).cuda()
    x = torch.randn(3, 4).to("cuda:0")
    loss = model(x).pow(2).mean()
    loss.backward()
    assert model.weight.device.type == "sim" and model.weight.grad.device.type == "sim"
    assert x.device == torch.device("sim", 0) and x.is_cuda is False
    with torch.device("cuda"):
        assert torch.ones(1).device.type == "sim"


def test_facade_answers_from_the_sim_module(sim_backend):
    assert torch.cuda.device_count() == len(sim_backend.devices)
    assert torch.cuda.get_device_name() == torch.sim.get_device_name(0)
    torch.cuda.synchronize()
    x = torch.zeros(256, device="cuda")
    assert torch.cuda.memory_allocated() == torch.sim.memory_allocated(0) > 0
    assert isinstance(torch.cuda.current_stream(), torch.sim.Stream)
    torch.cuda.manual_seed(3)
    a = torch.rand(2, device="cuda").cpu()
    torch.cuda.manual_seed(3)
    assert torch.equal(a, torch.rand(2, device="cuda").cpu())
    del x


def test_checkpoint_round_trip(sim_backend):
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(3.0, device="cuda")}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cuda:0")
    assert loaded["w"].device.type == "sim" and loaded["w"].cpu().tolist() == [0.0, 1.0, 2.0]


def test_cycles_restore_torch(sim_backend, torch_state):
    ft.deactivate()
    first = torch_state.snapshot()
    ft.auto_select_backend()
    ft.deactivate()
    assert torch_state.difference(first, torch_state.snapshot()) == []
    ft.auto_select_backend()


def test_moving_a_module_keeps_tied_weights_tied(sim_backend):
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    optimizer = torch.optim.SGD(embedding.parameters(), lr=0.1)  # built before the move
    model = torch.nn.ModuleDict({"embedding": embedding, "head": head}).cuda()
    assert model["head"].weight is model["embedding"].weight
    assert optimizer.param_groups[0]["params"][0] is model["embedding"].weight  # the same object
    assert model["head"].weight.device.type == "sim"
    model.to("cpu")
    assert model["head"].weight is model["embedding"].weight
    ft.deactivate()
    assert "_apply" not in vars(torch.nn.Module) or torch.nn.Module._apply.__module__ == "torch.nn.modules.module"


def test_memory_limit_assigned_while_active_is_enforced(sim_backend):
    block = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")  # no limit yet
    del block
    torch.cuda.empty_cache()  # a cached 4 MiB block would serve the next request
    ft.memory_virtual_limit = "2MiB"
    assert ft.current_backend().memory_limit_bytes() == 2 << 20
    with pytest.raises(torch.OutOfMemoryError, match="2"):
        torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    ft.memory_virtual_limit = None
    assert torch.empty(4 << 20, dtype=torch.uint8, device="cuda").numel() == 4 << 20


def test_pinned_memory_and_loader_pinning_on_sim(sim_backend):
    from torch.utils.data import DataLoader, TensorDataset

    host = torch.randn(6, 3)
    pinned = host.pin_memory()
    assert pinned.is_pinned() and pinned[1:].is_pinned() and not host.is_pinned()
    assert torch.equal(pinned, host) and pinned.data_ptr() != host.data_ptr()
    assert torch.empty(4, pin_memory=True).is_pinned()
    loader = DataLoader(TensorDataset(host), batch_size=3, pin_memory=True)
    batches = [b[0] for b in loader]
    assert all(b.is_pinned() for b in batches)
    moved = batches[0].to("cuda", non_blocking=True)
    assert moved.device.type == "sim" and torch.equal(moved.cpu(), host[:3])


def test_device_generators_on_sim(sim_backend):
    gen = torch.Generator("cuda")
    gen.manual_seed(7)
    assert isinstance(gen, torch.Generator) and gen.device == torch.device("sim", 0)
    drawn = torch.randn(5, device="cuda", generator=gen)
    reference = torch.Generator("cuda").manual_seed(7)
    assert drawn.device.type == "sim" and torch.equal(drawn.cpu(), torch.randn(5, device="cuda", generator=reference).cpu())
    assert gen.get_state().numel() == 16 and gen.get_offset() == 8
    torch.cuda.manual_seed(3)
    first = torch.rand(4, device="cuda")
    torch.cuda.manual_seed(3)
    assert torch.equal(first, torch.rand(4, device="cuda"))
    assert torch.cuda.default_generators[0] is torch.sim.default_generators[0]
    assert torch.cuda.default_generators[0].initial_seed() == 3


def test_profiler_records_the_sim_activity(sim_backend, capfd):
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Linear(8, 8).cuda()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model(torch.randn(2, 8, device="cuda")).sum().backward()
    assert ProfilerActivity.CUDA not in prof.activities
    assert ProfilerActivity.PrivateUse1 in prof.activities
    assert "CUDA used in profiler" not in capfd.readouterr().err
