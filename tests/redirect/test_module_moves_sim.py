"""``Module.to``/``.cuda()``/``.float()``/``.half()`` on the sim (PrivateUse1: a module of its own
process): parameters stay the same objects wherever CUDA keeps them, weak references and
optimizers built before the move included, and no move raises where plain torch does not."""
from __future__ import annotations

import weakref

import pytest
import torch

import flagos_torchfl as ft

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture
def sim_backend(monkeypatch):
    monkeypatch.setenv("FL_BACKEND", "sim")
    ft.deactivate()
    yield ft.auto_select_backend()
    ft.deactivate()


@pytest.fixture
def undeclared_compatibility():
    """A PrivateUse1 plugin that does not declare its tensors shallow-copy compatible with CPU
    tensors (the sim does, as torch_npu and torch_mlu do): PyTorch's ``Module._apply`` then
    replaces every moved Parameter."""
    library = torch.library.Library("aten", "IMPL")

    def compatible(self, other):
        return self.device == other.device and self.layout == other.layout

    for key in ("PrivateUse1", "AutogradPrivateUse1"):
        library.impl("_has_compatible_shallow_copy_type", compatible, key)
    yield
    library._destroy()


def _tied_model():
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(6, 4)
    head = torch.nn.Linear(4, 6, bias=False)
    head.weight = embedding.weight
    return torch.nn.ModuleDict({"embedding": embedding, "head": head})


def _train_step(model, optimizer, device):
    tokens = torch.tensor([1, 2, 3], device=device)
    loss = model["head"](model["embedding"](tokens)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


MOVES = [  # (label, the move, what it does to the values on the host)
    ("cuda()", lambda m: m.cuda(), lambda t: t),
    ("to('cuda:0')", lambda m: m.to("cuda:0"), lambda t: t),
    ("to(0)", lambda m: m.to(0), lambda t: t),
    ("cuda().half()", lambda m: m.cuda().half(), lambda t: t.half()),
    ("cuda().half().float()", lambda m: m.cuda().half().float(), lambda t: t.half().float()),
    ("cuda().to(torch.bfloat16)", lambda m: m.cuda().to(torch.bfloat16), lambda t: t.bfloat16()),
    ("cuda().cpu()", lambda m: m.cuda().cpu(), lambda t: t),
]


@pytest.mark.parametrize("label,move,on_host", MOVES, ids=[m[0] for m in MOVES])
def test_moves_keep_weakly_referenced_tied_parameters(sim_backend, label, move, on_host):
    model = _tied_model()
    weight = model["embedding"].weight
    weight.role = "embedding"
    finalizer = weakref.finalize(weight, lambda: None)  # what DeepSpeed's name map holds
    ref = weakref.ref(weight)
    expected = on_host(weight.detach().clone())
    moved = move(model)
    assert moved["embedding"].weight is weight and moved["head"].weight is weight
    assert ref() is weight and finalizer.alive and weight.role == "embedding"
    assert weight.dtype == expected.dtype and torch.equal(weight.detach().cpu(), expected)
    assert weight.device.type == ("cpu" if label.endswith("cpu()") else "sim")


def test_optimizer_built_before_the_move_trains_the_moved_model(sim_backend):
    model, reference = _tied_model(), _tied_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    model.cuda()
    assert optimizer.param_groups[0]["params"][0] is model["embedding"].weight
    losses = [_train_step(model, optimizer, "cuda") for _ in range(3)]
    expected = [_train_step(reference, reference_optimizer, "cpu") for _ in range(3)]
    assert losses == pytest.approx(expected, rel=1e-6) and losses[0] != losses[-1]


def test_gradients_move_with_their_parameters(sim_backend):
    model = torch.nn.Linear(3, 2)
    model(torch.ones(1, 3)).sum().backward()
    weight, grad = model.weight, model.weight.grad.clone()
    model.cuda().half()
    assert model.weight is weight and weight.grad.device.type == "sim"
    assert weight.grad.dtype == torch.float16 and torch.equal(weight.grad.cpu(), grad.half())


def test_plain_torch_moves_weakly_referenced_parameters_on_sim(sim_backend):
    ft.deactivate()  # the sim stays installed: PyTorch's own Module._apply
    model = torch.nn.Linear(3, 2)
    weight = model.weight
    finalizer = weakref.finalize(weight, lambda: None)
    model.to("sim").half()
    assert model.weight is weight and finalizer.alive and weight.device.type == "sim"


def test_undeclared_compatibility_swaps_into_the_original(sim_backend, undeclared_compatibility):
    model = _tied_model()
    weight = model["embedding"].weight
    weight.role = "embedding"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.cuda()
    assert model["embedding"].weight is weight and model["head"].weight is weight
    assert weight.device.type == "sim" and weight.role == "embedding"
    first = _train_step(model, optimizer, "cuda")
    assert _train_step(model, optimizer, "cuda") < first


def test_undeclared_compatibility_with_a_weak_reference_does_what_torch_does(
        sim_backend, undeclared_compatibility):
    def move(model):
        weight = model["embedding"].weight
        finalizer = weakref.finalize(weight, lambda: None)
        moved = model.to("sim")
        return weight, finalizer, moved

    ft.deactivate()
    plain_weight, _, plain = move(_tied_model())  # PyTorch itself: a new Parameter, no error
    assert plain["embedding"].weight is not plain_weight
    ft.auto_select_backend()
    weight, finalizer, model = move(_tied_model())
    kept = model["embedding"].weight
    assert kept is not weight and finalizer.alive and weight.device.type == "cpu"
    assert isinstance(kept, torch.nn.Parameter) and kept.device.type == "sim"
    assert model["head"].weight is kept  # tied parameters share the one replacement
    assert torch.equal(kept.detach().cpu(), plain["embedding"].weight.detach().cpu())


def test_undeclared_compatibility_with_a_live_graph_does_not_raise(sim_backend, undeclared_compatibility):
    model = torch.nn.Linear(3, 2)
    weight = model.weight
    loss = model(torch.ones(1, 3)).sum()  # the graph holds the CPU weight
    model.cuda()
    loss.backward()  # as in plain torch: the gradient reaches the tensor the graph used
    assert weight.grad is not None and weight.grad.device.type == "cpu"
    assert model.weight.device.type == "sim"


def test_deactivate_restores_module_apply(sim_backend):
    ft.deactivate()
    assert "_apply" not in vars(torch.nn.Module) or \
        torch.nn.Module._apply.__module__ == "torch.nn.modules.module"
