"""CUDA graphs and ``torch.compile(mode="reduce-overhead")`` on the plain sim (cases:
:mod:`tests.redirect.graph_cases`); the sim's own names: ``torch.sim.SIMGraph``, ``torch.sim.graph``."""
from __future__ import annotations

import pytest
import torch

from tests.redirect.graph_cases import *  # noqa: F401,F403 - the cases and their fixture

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
BACKEND = "sim"
PROFILE = None


def test_the_sims_device_module_carries_the_graph_api(accel):
    assert torch.cuda.CUDAGraph is torch.sim.SIMGraph
    assert torch.cuda.graph is torch.sim.graph
    x = torch.ones(2, device="sim")
    graph = torch.sim.SIMGraph()
    with torch.sim.graph(graph):
        y = x * 3
    x.fill_(2)
    graph.replay()
    assert y.tolist() == [6.0, 6.0]
