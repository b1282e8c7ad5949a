"""Shared test helper: record the floating-point input dtypes each ATen operator receives."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from flagos_torchfl.compat import tree_leaves


class InputDtypes(TorchDispatchMode):
    """``seen[op_name]``: the list of input-dtype tuples of each call of that operator."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtypes = tuple(t.dtype for t in tree_leaves((args, kwargs))
                       if isinstance(t, torch.Tensor) and t.is_floating_point())
        self.seen.setdefault(func.name(), []).append(dtypes)
        return func(*args, **kwargs)


def train_tiny_gpt2(device: str, steps: int = 20, autocast_dtype=None):
    """Train a transformers GPT-2 (tiny config, random weights, dropout off) on ``device`` for
    ``steps`` AdamW steps, the forward under ``torch.autocast(device, autocast_dtype)`` when a
    dtype is given. Returns (losses, module name -> floating-point output dtypes of step 1)."""
    import contextlib

    import pytest

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 64, (4, 16)).to(device)
    dtypes = {}

    def record(name):
        def hook(module, args, out):
            dtypes[name] = tuple(t.dtype for t in tree_leaves(out)
                                 if isinstance(t, torch.Tensor) and t.is_floating_point())
        return hook

    handles = [m.register_forward_hook(record(name)) for name, m in model.named_modules()]
    losses = []
    for _ in range(steps):
        context = torch.autocast(device, autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with context:
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        while handles:
            handles.pop().remove()
    return losses, dtypes
