"""Shared test helper: record the floating-point input dtypes each ATen operator receives."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


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
