"""Tensor factories: every function that creates a tensor on a ``device=`` it is given.

The list starts from PyTorch's own (``torch.utils._device._device_constructors()``, the set that
``with torch.device(...)`` consults) and adds what it lacks: the ``*_like`` family,
``torch.normal`` and the ``Tensor.new_*`` methods. ``nn`` layers build their parameters through
these functions (``nn.Linear(..., device="cuda")`` calls ``torch.empty(..., device="cuda")``), so
their ``device=`` is covered here too.

Each wrapper looks at ``device=`` (and, where the chip does not pin memory — the CPU: there is no
device to pin host memory for — turns ``pin_memory=True`` off) and calls the original; nothing else is added to a call.

The wrappers are invisible to torch's compilers: TorchScript resolves each one to its original's
ATen operator (its builtin table), so scripted torch code (``torch.distributed.optim``'s functional
optimizers) compiles as without the package; dynamo inlines a wrapper (the device translation stays
in the traced program) and traces the original inside it as torch's own function
(``redirect/compiling.py`` keeps dynamo's table of torch functions on the originals); and
``with torch.device(...)`` still reaches factories inside ``torch.compile`` (dynamo re-evaluates
``torch.utils._device._device_constructors()`` when it traces the device context, so that list
names the originals and their wrappers).
"""
from __future__ import annotations

import functools
import sys
import types
from typing import Callable, List, Tuple

import torch

from .devices import Target
from ..patching import Patcher
from .patches import patch_function

#: factories outside torch's device-constructor list that take ``device=``
LIKE_FACTORIES = (
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
    "randint_like", "normal",
)
TENSOR_NEW_METHODS = (
    "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor",
)


def script_as_original(patcher: Patcher, original: Callable, wrapper: Callable) -> None:
    """TorchScript compiles calls to ``wrapper`` as calls to ``original``'s ATen operator (it
    would otherwise try to compile the wrapper's source, and fail at its builtin)."""
    from torch.jit import _builtins

    table = _builtins._get_builtin_table()
    if id(original) in table:
        patcher.setitem(table, id(wrapper), table[id(original)])


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

    setattr(factory, ORIGINAL, original)
    return factory


ORIGINAL = "_flagos_torchfl_original"
"""The attribute of a factory wrapper holding the torch function it wraps."""


def original_of(function: Callable) -> Callable:
    """The torch function ``function`` wraps, if it is a factory wrapper (a Python function);
    else ``function``. Read from the wrapper's own namespace: asking anything else for an
    attribute can be a use of it (an unserved stand-in counts it for the verdict, as the
    program's, and refuses)."""
    if isinstance(function, types.FunctionType):
        return function.__dict__.get(ORIGINAL, function)
    return function


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


_ORIGINAL_CONSTRUCTORS: List[Callable] = []


def device_constructors() -> List[Callable]:
    """PyTorch's original device constructors, sorted by name. torch caches its list on first
    use, so it holds the unpatched functions as long as it is first read before any patch (the
    activation reads it first); kept here too, since the factories patch replaces the list."""
    if not _ORIGINAL_CONSTRUCTORS:
        from torch.utils._device import _device_constructors

        _ORIGINAL_CONSTRUCTORS.extend(sorted(_device_constructors(), key=lambda f: f.__name__))
    return list(_ORIGINAL_CONSTRUCTORS)


@patch_function("factories", on_cuda=True)
def patch_factories(target: Target, patcher: Patcher) -> None:
    """``torch.zeros/ones/empty/full/rand/randn/randint/arange/tensor/...(device=...)``: torch's
    36 device constructors, wherever they are exposed (``torch.fft.fftfreq``...); the device
    context's list of constructors names them and their wrappers."""
    import torch.utils._device as device_module

    originals = device_constructors()
    wrappers = []
    for function in originals:
        wrapper = factory_wrapper(function, target)
        for owner, attr in _owners(function):
            patcher.setattr(owner, attr, wrapper)
        script_as_original(patcher, function, wrapper)
        wrappers.append(wrapper)
    listed = frozenset(originals) | frozenset(wrappers)

    def _device_constructors():
        return listed

    patcher.replace_in((device_module, sys.modules.get("torch._inductor.codecache")), "_device_constructors",
                       device_module._device_constructors, _device_constructors)


@patch_function("like_factories", on_cuda=True)
def patch_like_factories(target: Target, patcher: Patcher) -> None:
    """``torch.zeros_like/ones_like/empty_like/full_like/rand_like/randn_like/randint_like``
    and ``torch.normal`` with ``device=``."""
    for name in LIKE_FACTORIES:
        original = patcher.wrap(torch, name, lambda original: factory_wrapper(original, target))
        script_as_original(patcher, original, getattr(torch, name))


@patch_function("tensor_new", on_cuda=True)
def patch_tensor_new(target: Target, patcher: Patcher) -> None:
    """``Tensor.new_empty/new_zeros/new_ones/new_full/new_tensor/new_empty_strided(device=...)``."""
    for name in TENSOR_NEW_METHODS:
        patcher.wrap(torch.Tensor, name, lambda original: factory_wrapper(original, target))
