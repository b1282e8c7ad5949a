"""Moving tensors and modules: ``Tensor.to/.cuda/.type``, ``Module.to/.cuda/.to_empty``, and
pinned host memory (``Tensor.pin_memory``, ``DataLoader(pin_memory=True)``).

``Tensor.is_cuda`` is deliberately not patched (see :mod:`.devices`): it stays truthful.
"""
from __future__ import annotations

import functools
import threading

import torch

from .devices import Target
from .patches import Patcher, patch_function

_DEVICE_CLASSES = (str, torch.device, int)


def _translate_first(target: Target, args: tuple) -> tuple:
    """``args`` with a leading device-like value (str, torch.device, int) translated."""
    if args and args[0].__class__ in _DEVICE_CLASSES:
        first = target.translate(args[0])
        if first is not args[0]:
            return (first,) + args[1:]
    return args


@patch_function("tensor_to", on_cuda=True)
def patch_tensor_to(target: Target, patcher: Patcher) -> None:
    """``Tensor.to("cuda:N" | torch.device | N, ...)``, ``Tensor.to(device=...)`` and
    ``Tensor.cuda(N | "cuda:N" | None)``; ``.to(dtype)`` and ``.to(other)`` pass straight on."""
    original_to = torch.Tensor.to
    translate = target.translate

    @functools.wraps(original_to)
    def to(self, *args, **kwargs):
        if args and args[0].__class__ in _DEVICE_CLASSES:
            args = _translate_first(target, args)
        device = kwargs.get("device")
        if device is not None:
            kwargs["device"] = translate(device)
        return original_to(self, *args, **kwargs)

    @functools.wraps(torch.Tensor.cuda)
    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        dest = translate("cuda" if device is None else device)
        return original_to(self, dest, non_blocking=non_blocking, memory_format=memory_format)

    patcher.setattr(torch.Tensor, "to", to)
    patcher.setattr(torch.Tensor, "cuda", cuda)


@patch_function("module_to", on_cuda=True)
def patch_module_to(target: Target, patcher: Patcher) -> None:
    """``Module.to("cuda" | N | torch.device, ...)``, ``Module.cuda(N)`` and
    ``Module.to_empty(device=...)``."""
    module = torch.nn.Module
    original_to = module.to
    original_to_empty = module.to_empty
    translate = target.translate

    @functools.wraps(original_to)
    def to(self, *args, **kwargs):
        args = _translate_first(target, args)
        if kwargs.get("device") is not None:
            kwargs["device"] = translate(kwargs["device"])
        return original_to(self, *args, **kwargs)

    @functools.wraps(module.cuda)
    def cuda(self, device=None):
        return original_to(self, translate("cuda" if device is None else device))

    @functools.wraps(original_to_empty)
    def to_empty(self, *, device, recurse=True):
        return original_to_empty(self, device=translate(device), recurse=recurse)

    patcher.setattr(module, "to", to)
    patcher.setattr(module, "cuda", cuda)
    patcher.setattr(module, "to_empty", to_empty)


@patch_function("module_tied_parameters")
def patch_module_tied_parameters(target: Target, patcher: Patcher) -> None:
    """On a PrivateUse1 backend (Ascend, Cambricon, Moore Threads, sim), ``Module.to``/``.cuda``
    keep every parameter the same Python object: tied (shared) parameters stay tied, and an
    optimizer built before the move (as the DDP tutorial builds it) still holds the model's
    parameters.

    A PrivateUse1 tensor cannot take over a CPU parameter's ``.data`` (PyTorch counts only CPU,
    CUDA, HIP, MPS, XPU and HPU tensors as shallow-copy compatible), so ``Module._apply`` would
    put a new Parameter in each module separately. The wrapped ``_apply`` runs with PyTorch's
    ``swap_module_params_on_conversion`` on instead: each parameter swaps its contents with the
    converted tensor (``torch.utils.swap_tensors``). Other backends are left alone."""
    if target.chip.dispatch_key != "PrivateUse1":
        return
    future = torch.__future__
    local = threading.local()

    def make(original):
        @functools.wraps(original)
        def _apply(self, fn, recurse=True):
            if getattr(local, "inside", False):
                return original(self, fn, recurse)
            before = future.get_swap_module_params_on_conversion()
            local.inside = True
            future.set_swap_module_params_on_conversion(True)
            try:
                return original(self, fn, recurse)
            finally:
                future.set_swap_module_params_on_conversion(before)
                local.inside = False

        return _apply

    patcher.wrap(torch.nn.Module, "_apply", make)


@patch_function("pin_memory")
def patch_pin_memory(target: Target, patcher: Patcher) -> None:
    """``Tensor.pin_memory()`` and ``DataLoader(pin_memory=True, pin_memory_device="cuda")``.

    Where the chip does not pin memory (the CPU: there is no device to pin for),
    ``pin_memory()`` returns the tensor itself (``is_pinned()`` stays truthfully False) and
    DataLoader's ``pin_memory`` is turned off. Elsewhere pinning is the backend's own; only the
    deprecated ``pin_memory_device="cuda"`` is cleared (torch pins for the current accelerator).
    """
    from torch.utils.data import DataLoader

    pins = target.chip.pins_memory

    def edit(values: dict) -> None:
        if not pins:
            values.pop("pin_memory", None)
            values.pop("pin_memory_device", None)
        elif target.translate_named(values.get("pin_memory_device", "")) != values.get("pin_memory_device", ""):
            values.pop("pin_memory_device")

    patcher.wrap_arguments(DataLoader, "__init__", edit)
    if not pins:
        original_pin = torch.Tensor.pin_memory

        @functools.wraps(original_pin)
        def pin_memory(self, *args, **kwargs):
            return self

        patcher.setattr(torch.Tensor, "pin_memory", pin_memory)
