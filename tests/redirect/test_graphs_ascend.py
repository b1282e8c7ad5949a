"""CUDA graphs and ``torch.compile(mode="reduce-overhead")`` under the Ascend profile (cases:
:mod:`tests.redirect.graph_cases`): the API carries torch_npu's names (``torch.npu.NPUGraph``,
``torch.npu.graph``, ``torch.npu.make_graphed_callables``, ``torch.npu.graph_pool_handle``) and
the verdict counts no graph use as missing on the chip."""
from __future__ import annotations

import pytest
import torch

from flagos_torchfl.tables.device_modules import missing_uses
from tests.redirect.graph_cases import *  # noqa: F401,F403 - the cases and their fixture

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
BACKEND = "sim"
PROFILE = "ascend"


def test_the_graph_api_carries_torch_npus_names(accel):
    assert torch.cuda.CUDAGraph is torch.npu.NPUGraph and torch.npu.NPUGraph.__name__ == "NPUGraph"
    assert torch.cuda.graph is torch.npu.graph
    x = torch.ones(4, 4, device="npu", requires_grad=True)
    layer = torch.nn.Linear(4, 4).npu()
    graphed = torch.npu.make_graphed_callables(layer, (x,), pool=torch.npu.graph_pool_handle())
    out = graphed(x)
    out.sum().backward()
    assert torch.allclose(out, x @ layer.weight.T + layer.bias, atol=1e-6)
    with pytest.raises(RuntimeError, match="NPU error: " + REFUSED):
        with torch.npu.graph(torch.npu.NPUGraph()):
            x.sum().item()
    used = {name for name, _ in missing_uses.rows("ascend")}
    assert not used & {"CUDAGraph", "graph", "make_graphed_callables", "graph_pool_handle",
                       "is_current_stream_capturing"}
