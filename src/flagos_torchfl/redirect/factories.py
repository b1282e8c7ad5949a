"""Tensor factories: every function that creates a tensor on a ``device=`` it is given.

The list starts from PyTorch's own (``torch.utils._device._device_constructors()``, the set that
``with torch.device(...)`` consults) and adds what it lacks: the ``*_like`` family,
``torch.normal`` and the ``Tensor.new_*`` methods. ``nn`` layers build their parameters through
these functions (``nn.Linear(..., device="cuda")`` calls ``torch.empty(..., device="cuda")``), so
their ``device=`` is covered here too.

Each wrapper looks at ``device=`` (and, where the chip does not pin memory — the CPU: there is no
device to pin host memory for — turns ``pin_memory=True`` off) and calls the original; nothing else is added to a call.
"""
from __future__ import annotations

import functools
from typing import Callable, Iterable, List, Tuple

import torch

from .devices import Target
from .patches import Patcher, patch_function

#: factories outside torch's device-constructor list that take ``device=``
LIKE_FACTORIES = (
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
    "randint_like", "normal",
)
TENSOR_NEW_METHODS = (
    "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor",
)


def factory_wrapper(original: Callable, target: Target) -> Callable:
    """``original`` with its ``device=`` keyword translated, and ``pin_memory=True`` dropped
    where the chip does not pin memory, or applied after allocation where it cannot pin at
    allocation (the sim)."""
    translate = target.translate
    drop_pin = not target.chip.pins_memory
    pin_after = not drop_pin and not target.chip.pins_at_allocation

    @functools.wraps(original)
    def factory(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None:
            kwargs["device"] = translate(device)
        if kwargs.get("pin_memory") and (drop_pin or pin_after):
            kwargs["pin_memory"] = False
            if pin_after:
                return original(*args, **kwargs).pin_memory()
        return original(*args, **kwargs)

    return factory


def _owners(function: Callable) -> List[Tuple[object, str]]:
    """Where ``function`` is reachable as a public torch attribute (``fft_fftfreq`` is
    ``torch.fft.fftfreq``; ``nested_tensor`` is ``torch.nested.nested_tensor``)."""
    name = function.__name__
    found = []
    for owner, prefix in ((torch, ""), (torch.fft, "fft_"), (torch.nested, ""), (torch.sparse, "sparse_")):
        attr = name[len(prefix):] if prefix and name.startswith(prefix) else name
        if getattr(owner, attr, None) is function:
            found.append((owner, attr))
    return found


def device_constructors() -> Iterable[Callable]:
    """PyTorch's original device constructors, sorted by name. The list is cached by torch on
    first use, so it holds the unpatched functions as long as it is first read before any patch
    (the first patch family reads it)."""
    from torch.utils._device import _device_constructors

    return sorted(_device_constructors(), key=lambda f: f.__name__)


@patch_function("factories", on_cuda=True)
def patch_factories(target: Target, patcher: Patcher) -> None:
    """``torch.zeros/ones/empty/full/rand/randn/randint/arange/tensor/...(device=...)``: torch's
    36 device constructors, wherever they are exposed (``torch.fft.fftfreq``...)."""
    for function in device_constructors():
        for owner, attr in _owners(function):
            patcher.setattr(owner, attr, factory_wrapper(function, target))


@patch_function("like_factories", on_cuda=True)
def patch_like_factories(target: Target, patcher: Patcher) -> None:
    """``torch.zeros_like/ones_like/empty_like/full_like/rand_like/randn_like/randint_like``
    and ``torch.normal`` with ``device=``."""
    for name in LIKE_FACTORIES:
        patcher.wrap(torch, name, lambda original: factory_wrapper(original, target))


@patch_function("tensor_new", on_cuda=True)
def patch_tensor_new(target: Target, patcher: Patcher) -> None:
    """``Tensor.new_empty/new_zeros/new_ones/new_full/new_tensor/new_empty_strided(device=...)``."""
    for name in TENSOR_NEW_METHODS:
        patcher.wrap(torch.Tensor, name, lambda original: factory_wrapper(original, target))
