"""CUDA graphs and ``torch.compile(mode="reduce-overhead")`` on the cpu backend (cases:
:mod:`tests.redirect.graph_cases`): capture records the operators and replay runs them again on
the host; no graph speed-up is promised."""
from __future__ import annotations

import torch

from tests.redirect.graph_cases import *  # noqa: F401,F403 - the cases and their fixture

BACKEND = "cpu"
PROFILE = None


def test_reduce_overhead_compiles_a_program_that_never_names_cuda(accel):
    """Plain torch compiles it and skips graphs for its CPU tensors; so it does under activation."""
    model = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    compiled = torch.compile(model, mode="reduce-overhead")
    assert torch.allclose(compiled(x), model(x), atol=1e-6)
    assert compiled(x).device.type == "cpu"


def test_the_graph_class_is_cudas_name_on_the_host(accel):
    assert torch.cuda.CUDAGraph.__name__ == "CUDAGraph"
    assert isinstance(torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph)
