"""``torch.accelerator.Graph`` (torch 2.12 on) on the sim: the C++ runtime registers the sim's
graphs as the device type's graph implementation, so the device-generic class captures and
replays as ``torch.sim.SIMGraph`` does, with its pools and its refusals; and
``torch.accelerator.get_device_capability()`` lists the dtypes the sim holds and copies."""
from __future__ import annotations

import pytest
import torch

from flagos_torchfl.sim.runtime import capability
from tests.redirect.graph_cases import REFUSED, accel  # noqa: F401 - the fixture

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim,
              pytest.mark.skipif(not hasattr(getattr(torch, "accelerator", None), "Graph"),
                                 reason="torch.accelerator.Graph arrived in torch 2.12")]
BACKEND = "sim"
PROFILE = None


def test_accelerator_graph_captures_and_replays_on_the_sim(accel):
    x = torch.zeros(4, device="cuda")
    stream = torch.Stream()
    graph = torch.accelerator.Graph()
    with stream, graph:
        x += 1
        y = x * 2
    assert x.tolist() == [0.0] * 4  # a capture changes nothing, as on CUDA
    graph.replay()
    graph.replay()
    assert x.tolist() == [2.0] * 4 and y.tolist() == [4.0] * 4
    shared = torch.accelerator.Graph(pool=graph.pool())
    with stream, shared:
        z = y + 1
    shared.replay()
    assert z.tolist() == [5.0] * 4 and shared.pool() == graph.pool()
    graph.reset()
    with pytest.raises(RuntimeError, match="SIMGraph::replay without a preceding successful capture"):
        graph.replay()


def test_accelerator_graph_refuses_what_a_capture_forbids(accel):
    x = torch.ones(3, device="cuda")
    graph = torch.accelerator.Graph(capture_error_mode="thread_local")
    with torch.Stream():
        graph.capture_begin()
        with pytest.raises(RuntimeError, match=REFUSED):
            x.sum().item()
        with pytest.raises(torch.AcceleratorError, match="previous error during capture"):
            graph.capture_end()
    with pytest.raises(RuntimeError, match="must be captured on a non-default stream"):
        torch.accelerator.Graph().capture_begin()


def test_device_capability_lists_the_dtypes_the_sim_holds_and_copies(accel):
    listed = torch.accelerator.get_device_capability()["supported_dtypes"]
    assert listed == set(capability.supported_dtypes())
    every = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    assert {torch.float32, torch.bfloat16, torch.int64, torch.bool} <= listed < every
    assert not listed & {getattr(torch, n, None) for n in ("bits8", "int5", "uint3", "quint4x2")}
    for dtype in listed:  # each holds its bytes on the device and converts
        raw = (torch.arange(4 * dtype.itemsize) % 2).to(torch.uint8)
        on_device = raw.view(dtype).to("cuda")
        assert torch.equal(on_device.cpu().view(torch.uint8), raw), dtype
        assert on_device.to(torch.float32).device == on_device.device
