"""The sim with its Python guard (``runtime="python"``: what runs where no C++ compiler is): the
device module keeps each thread's current device and its own inline streams and events, the
Python patches stand in for what the C++ side cannot be told (pinned memory, the autograd engine
of several devices, ``torch.accelerator``'s device calls), and a model trains on either device."""
from __future__ import annotations

import os

import pytest
import torch

import flagos_torchfl as ft
import flagos_torchfl.sim as fsim

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def sim():
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ.update(FL_SIM_RUNTIME="python", FL_SIM_DEVICES="2")
    ft.init_backend("sim")  # with routing: the operators the sim lacks take their routes
    assert fsim.runtime_kind() == "python" and fsim.cpp_problem() is None
    yield torch.sim
    ft.deactivate()


def test_the_device_module_switches_devices(sim):
    with sim.device(1):
        assert torch.empty(2, device="sim").device == torch.device("sim:1")
        assert torch.accelerator.current_device_index() == 1
    torch.accelerator.set_device_index(1)
    assert sim.current_device() == 1
    sim.set_device(0)


def test_inline_streams_and_events(sim):
    s = sim.Stream(1)
    assert s.device == torch.device("sim:1") and s.query() and s != sim.default_stream(1)
    with sim.stream(s):
        assert sim.current_stream(1) == s and sim.current_device() == 1
    start, end = sim.Event(enable_timing=True), sim.Event(enable_timing=True)
    start.record(s)
    end.record(s)
    assert start.elapsed_time(end) >= 0
    with pytest.raises(RuntimeError, match="enable_timing"):
        sim.Event().elapsed_time(end)


def test_pinned_memory_and_training_on_the_second_device(sim):
    pinned = torch.arange(4.0).pin_memory()
    assert pinned.is_pinned() and not torch.arange(4.0).is_pinned()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to("sim:1")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4).to("sim:1"), torch.randn(16, 1).to("sim:1")
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and next(model.parameters()).grad.device == torch.device("sim:1")


def test_what_only_the_native_runtime_answers_says_so(sim):
    with pytest.raises(RuntimeError, match="device capabilities"):
        torch.accelerator.get_device_capability("sim:0")
