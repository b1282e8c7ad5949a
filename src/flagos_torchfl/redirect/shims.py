"""Vendor migration shims that patch torch themselves: torch_npu's ``transfer_to_npu``,
torch_mlu's ``gpu_migration`` and torchada. If one has run, activating on top of it would put
two layers of patches on one function, so activation refuses and names it.

A shim is recognised either by its module having been imported (importing it applies its
patches) or by one of the entry points this layer patches already being a function of that
package.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, Optional, Tuple

import torch

from ..errors import ActivationError

#: (what to call it, module whose import applies it, package prefix of its wrappers)
KNOWN_SHIMS: Tuple[Tuple[str, str, str], ...] = (
    ("torch_npu transfer_to_npu", "torch_npu.contrib.transfer_to_npu", "torch_npu.contrib"),
    ("torch_mlu gpu_migration", "torch_mlu.utils.gpu_migration", "torch_mlu.utils.gpu_migration"),
    ("torchada", "torchada", "torchada"),
)


def sentinels() -> Iterable[Tuple[str, Any]]:
    """(name, current object) of entry points every shim patches."""
    yield "torch.zeros", torch.zeros
    yield "torch.empty", torch.empty
    yield "torch.Tensor.to", torch.Tensor.to
    yield "torch.Tensor.cuda", torch.Tensor.cuda
    yield "torch.nn.Module.to", torch.nn.Module.to
    yield "torch.cuda.is_available", vars(torch.cuda).get("is_available")
    yield "torch.cuda.device_count", vars(torch.cuda).get("device_count")


def _owner(obj: Any) -> str:
    """The module that defined ``obj``: for a Python function the module of its globals (a
    wrapper made with ``functools.wraps`` copies ``__module__`` from what it wraps)."""
    function = getattr(obj, "__func__", obj)
    defined = getattr(function, "__globals__", None)
    if isinstance(defined, dict):
        return str(defined.get("__name__", ""))
    return str(getattr(obj, "__module__", "") or "")


def find_shim() -> Optional[str]:
    """A sentence naming the shim that has patched torch, or None when there is none."""
    for label, module, prefix in KNOWN_SHIMS:
        if module in sys.modules:
            return f"{label} is active ({module} has been imported)"
    for where, obj in sentinels():
        owner = _owner(obj)
        for label, _module, prefix in KNOWN_SHIMS:
            if owner == prefix or owner.startswith(prefix + "."):
                return f"{label} is active ({where} is {owner}.{getattr(obj, '__name__', '?')})"
    return None


def refuse_if_shimmed() -> None:
    """Raise ActivationError when a vendor migration shim has already patched torch."""
    found = find_shim()
    if found:
        raise ActivationError(
            f"cannot activate flagos_torchfl: {found}. Both patch the same torch functions; "
            "remove the shim's import (flagos_torchfl redirects CUDA code itself) or do not "
            "activate flagos_torchfl in this process"
        )
