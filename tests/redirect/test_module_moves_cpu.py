"""``Module.to``/``.cuda()``/``.float()``/``.half()`` on the cpu backend keep parameters exactly as
plain PyTorch does: the same objects, weak references, tied parameters and optimizers included."""
from __future__ import annotations

import weakref

import pytest
import torch

import flagos_torchfl as ft

MOVES = [  # (label, the CUDA-written move, the same move written for the host in plain torch)
    ("cuda()", lambda m: m.cuda(), lambda m: m.cpu()),
    ("to('cuda:0')", lambda m: m.to("cuda:0"), lambda m: m.to("cpu")),
    ("to(0)", lambda m: m.to(0), lambda m: m.to("cpu")),
    ("cuda().half()", lambda m: m.cuda().half(), lambda m: m.half()),
    ("cuda().half().float()", lambda m: m.cuda().half().float(), lambda m: m.half().float()),
    ("cuda().to(torch.bfloat16)", lambda m: m.cuda().to(torch.bfloat16), lambda m: m.bfloat16()),
]


def _move(move) -> dict:
    """What ``move`` does to a tied, weakly referenced model with an optimizer built first."""
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(6, 4)
    head = torch.nn.Linear(4, 6, bias=False)
    head.weight = embedding.weight
    model = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    weight = embedding.weight
    finalizer = weakref.finalize(weight, lambda: None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    moved = move(model)
    return {
        "same": moved["embedding"].weight is weight,
        "tied": moved["head"].weight is moved["embedding"].weight,
        "optimizer": optimizer.param_groups[0]["params"][0] is moved["embedding"].weight,
        "weakref alive": finalizer.alive,
        "device": weight.device, "dtype": weight.dtype,
        "values": moved["embedding"].weight.detach().clone(),
    }


@pytest.mark.parametrize("label,move,host_move", MOVES, ids=[m[0] for m in MOVES])
def test_moves_match_plain_torch(cpu_backend, label, move, host_move):
    activated = _move(move)
    ft.deactivate()
    plain = _move(host_move)
    assert plain["same"] and plain["tied"] and plain["optimizer"] and plain["weakref alive"]
    values = activated.pop("values")
    assert torch.equal(values, plain.pop("values"))
    assert activated == plain
