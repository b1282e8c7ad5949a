"""Operator coverage read from PyTorch's dispatcher at run time (never a constant)."""
from __future__ import annotations

from typing import List


def native_ops(dispatch_key: str) -> List[str]:
    """ATen operator overloads with a kernel registered for ``dispatch_key``."""
    import torch

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return sorted(
        name for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::") and has(name, dispatch_key)
    )


def native_op_count(dispatch_key: str) -> int:
    return len(native_ops(dispatch_key))
