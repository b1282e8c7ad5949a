"""Dtype gaps: operators a backend has natively, but not for some dtypes (declared in the
backend's file as ``dtype_gaps``). Those operators get a route for those dtypes only."""
from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, Mapping

import torch

from ..errors import ConfigError, suggestion
from ..aten import names
from ..aten.dtypes import dtype_mask


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        valid = sorted(k for k, v in vars(torch).items() if isinstance(v, torch.dtype))
        raise ConfigError(f"dtype_gaps: {name!r} is not a torch dtype.{suggestion(str(name), valid)}")
    return value


def resolve_gaps(declared: Mapping[str, Iterable[str]], native: FrozenSet[str]) -> Dict[str, int]:
    """``{"float64": ("matmul", "aten::cumsum")}`` -> overload -> dtype bit set, for the native
    overloads the names cover (``"*"``: every native overload)."""
    gaps: Dict[str, int] = {}
    for dtype_name, entries in dict(declared or {}).items():
        if isinstance(entries, str):
            entries = (entries,)
        bit = dtype_mask([_dtype(dtype_name)])
        for entry in entries:
            ops = native if entry == "*" else names.resolve(entry)
            for op in ops:
                if op in native:
                    gaps[op] = gaps.get(op, 0) | bit
    return gaps
