"""The factory wrappers are invisible to torch's compilers: TorchScript compiles torch code that
calls them (``torch.distributed.optim``'s functional optimizers are scripted at import), and a
factory inside ``torch.compile`` honours ``with torch.device(...)`` as in plain torch."""
from __future__ import annotations

import functools
import textwrap

import pytest
import torch

import flagos_torchfl as ft
from tests.helpers import run_python


def scripted_factories(x: torch.Tensor) -> torch.Tensor:
    return x + torch.zeros(2) + torch.tensor([1.0, 2.0]) + torch.ones_like(x) + torch.full((2,), 3.0)


def test_torchscript_compiles_calls_to_the_wrapped_factories(cpu_backend):
    scripted = torch.jit.script(scripted_factories)
    assert scripted(torch.ones(2)).tolist() == [6.0, 7.0]
    assert "aten::zeros" in str(scripted.graph) and "aten::ones_like" in str(scripted.graph)


def test_a_compiled_factory_takes_the_default_device(cpu_backend):
    @torch.compile(backend="eager")
    def add_zeros(x):
        return x + torch.zeros(2) + torch.ones_like(x)

    with torch.device("meta"):
        x = torch.ones(2)
        assert x.device.type == "meta" and add_zeros(x).device.type == "meta"
    assert add_zeros(torch.ones(2)).tolist() == [2.0, 2.0]


def test_a_compiled_factory_still_translates_cuda(cpu_backend):
    @torch.compile(backend="eager")
    def on_cuda(x):
        return x + torch.zeros(2, device="cuda")

    assert on_cuda(torch.ones(2)).device.type == "cpu"
    with torch.device("cuda"):  # the selected backend's device, for the context too
        assert on_cuda(torch.ones(2)).device.type == "cpu"


@pytest.mark.torch_feature("dynamo_trace_rules")
def test_wrapped_tensor_methods_compile_without_a_graph_break(cpu_backend):
    """``Tensor.new_ones`` ... are wrappers under activation; dynamo puts the methods they wrap in
    the graph as in plain torch (it once broke the graph at each: torchtitan's compiled
    ``create_block_mask``), under a TorchFunctionMode too."""
    import torch._dynamo.utils as dynamo_utils
    from torch.overrides import TorchFunctionMode

    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def program(x):
        with Passing():
            made = x.new_ones(3) + x.new_zeros(3, device="cuda") + x.new_full((3,), 2.0) + x.new_empty(3).fill_(1)
        return made + x.to("cuda") + x.cuda() + torch.ones(3, device="cuda")

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = torch.compile(program, backend="eager")
    assert compiled(torch.ones(3)).tolist() == program(torch.ones(3)).tolist() == [7.0] * 3
    assert not dynamo_utils.counters["graph_break"], dict(dynamo_utils.counters["graph_break"])


def test_deactivation_gives_the_device_context_torch_s_list_back(cpu_backend):
    from torch.utils import _device

    wrapper = torch.zeros
    assert wrapper in _device._device_constructors()  # the wrapper, for dynamo's traces
    ft.deactivate()
    listed = _device._device_constructors()
    assert isinstance(_device._device_constructors, functools._lru_cache_wrapper)  # torch's own
    assert torch.zeros in listed and wrapper not in listed


ZERO = textwrap.dedent("""
    import torch, torch.distributed as dist
    import flagos_torchfl as ft
    ft.auto_select_backend()
    import torch.distributed.optim  # its functional optimizers are scripted at import
    from torch.distributed.optim import ZeroRedundancyOptimizer
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    model = torch.nn.Linear(4, 2).cuda()
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    before = model.weight.detach().clone()
    model(torch.ones(3, 4, device="cuda")).sum().backward()
    opt.step()
    print("moved", bool((model.weight != before).all()), model.weight.device.type)
    dist.destroy_process_group()
""")


@pytest.mark.full
@pytest.mark.parametrize("backend", ["cpu", pytest.param("sim", marks=pytest.mark.needs_sim)])
def test_zero_redundancy_optimizer_imports_and_steps(backend):
    proc = run_python(["-c", ZERO], env={"FL_BACKEND": backend}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"moved True {backend}" in proc.stdout
