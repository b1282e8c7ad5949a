"""Sets of dtypes as bit masks: cheap keys for routing decisions and compact report rows."""
from __future__ import annotations

from typing import Iterable, List, Tuple

import torch

_DTYPES = [d for d in vars(torch).values() if isinstance(d, torch.dtype)]
_BIT = {d: 1 << i for i, d in enumerate(dict.fromkeys(_DTYPES))}


def dtype_mask(dtypes: Iterable[torch.dtype]) -> int:
    """The bit set standing for a collection of dtypes."""
    mask = 0
    for d in dtypes:
        mask |= _BIT[d]
    return mask


def dtypes_of(mask: int) -> List[torch.dtype]:
    """The dtypes in a bit set, in a stable order."""
    return [d for d, bit in _BIT.items() if mask & bit]


def dtype_names(mask: int) -> List[str]:
    """``["float32", "int64"]``: the names of the dtypes in a bit set."""
    return [str(d).replace("torch.", "") for d in dtypes_of(mask)]


def call_signature(args: tuple, kwargs: dict) -> Tuple[int, bool]:
    """(dtype bit set of the tensor arguments and ``dtype=``, whether autograd is needed)."""
    mask = 0
    needs_grad = False
    grad = torch.is_grad_enabled()
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            mask |= _BIT[value.dtype]
            needs_grad = needs_grad or (grad and value.requires_grad)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    mask |= _BIT[item.dtype]
                    needs_grad = needs_grad or (grad and item.requires_grad)
        elif isinstance(value, torch.dtype):
            mask |= _BIT[value]
    return mask, needs_grad
