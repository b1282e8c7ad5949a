"""Moving tensors and modules: ``Tensor.to/.cuda/.type``, ``Module.to/.cuda/.to_empty``, and
pinned host memory (``Tensor.pin_memory``, ``DataLoader(pin_memory=True)``).

``Tensor.is_cuda`` is deliberately not patched (see :mod:`.devices`): it stays truthful.
"""
from __future__ import annotations

import functools
import threading
import weakref

import torch

from .devices import Target
from ..patching import Patcher
from .patches import patch_function

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
    original_to, original_cuda = torch.Tensor.to, torch.Tensor.cuda
    translate = target.translate

    @functools.wraps(original_to)
    def to(self, *args, **kwargs):
        if args and args[0].__class__ in _DEVICE_CLASSES:
            args = _translate_first(target, args)
        device = kwargs.get("device")
        if device is not None:
            kwargs["device"] = translate(device)
        return original_to(self, *args, **kwargs)

    @functools.wraps(original_cuda)
    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        dest = translate("cuda" if device is None else device)
        return original_to(self, dest, non_blocking=non_blocking, memory_format=memory_format)

    patcher.setattr(torch.Tensor, "to", to)
    patcher.setattr(torch.Tensor, "cuda", cuda)
    _allow_on_uninitialized(patcher, {original_to: to, original_cuda: cuda})


def _allow_on_uninitialized(patcher: Patcher, replaced: dict) -> None:
    """Lazy modules' uninitialized parameters accept only the methods in
    ``UninitializedTensorMixin._allowed_methods`` (``to`` and ``cuda`` among them) and recognise
    a method by the function ``torch.Tensor`` holds under its name: the wrappers that replace
    those methods are allowed beside the originals, so ``LazyLinear(4).to(torch.float)`` and
    ``.cuda()`` work as in plain torch."""
    mixin = torch.nn.parameter.UninitializedTensorMixin
    allowed = list(mixin._allowed_methods)
    added = [wrapper for original, wrapper in replaced.items() if original in allowed]
    patcher.setattr(mixin, "_allowed_methods", allowed + added)


@patch_function("storage_to", on_cuda=True)
def patch_storage_to(target: Target, patcher: Patcher) -> None:
    """Storages: ``untyped_storage().cuda(N)``, ``storage().cuda()`` and ``.to(device="cuda")``
    copy to the backend's device (``TypedStorage`` goes through its untyped storage's); a
    storage already there is returned itself, as CUDA returns one already on the device."""
    base = torch.storage._StorageBase
    original_to = getattr(base, "to", None) or _storage_to  # torch 2.1 has no Storage.to
    translate = target.translate

    @functools.wraps(original_to)
    def to(self, *, device, non_blocking=False):
        return original_to(self, device=translate(device), non_blocking=non_blocking)

    @functools.wraps(base.cuda)
    def cuda(self, device=None, non_blocking=False):
        return original_to(self, device=translate("cuda" if device is None else device), non_blocking=non_blocking)

    if hasattr(base, "to"):
        patcher.setattr(base, "to", to)
    patcher.setattr(base, "cuda", cuda)


def _storage_to(storage, *, device, non_blocking=False):
    """``storage`` on ``device`` (a new untyped storage holding a copy; the storage itself where
    it is there already)."""
    device = torch.device(device)
    if storage.device == device:
        return storage
    copy = torch.UntypedStorage(storage.nbytes(), device=device)
    copy.copy_(storage, non_blocking)
    return copy


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
    """On a PrivateUse1 backend, ``Module.to``/``.cuda()``/``.half()`` keep each parameter the
    same Python object wherever CUDA would (a move between the host and the chip, a dtype
    change): tied parameters stay tied, and an optimizer built before the move (as the DDP
    tutorial builds it) still holds the model's parameters.

    Where the chip's plugin declares its tensors shallow-copy compatible with CPU tensors
    (torch_npu, torch_mlu and the sim do), PyTorch itself keeps the object (``param.data =
    moved``) and this patch has nothing to do. Where it does not, ``Module._apply`` puts a new
    Parameter in each module; the wrapped ``_apply`` then swaps the moved contents into the
    original object (``torch.utils.swap_tensors``; its attributes stay), and where no swap is
    possible (a weak reference to the parameter, another holder of its tensor) it keeps
    PyTorch's new Parameter, shared by every module that held the original. It never raises
    where PyTorch does not. Other backends, and programs that set ``torch.__future__``'s
    overwrite or swap flag themselves, are left to PyTorch."""
    if target.chip.dispatch_key != "PrivateUse1":
        return
    kinds = ("cpu", target.chip.device_type)
    future = torch.__future__
    local = threading.local()

    def make(original):
        @functools.wraps(original)
        def _apply(self, fn, recurse=True):
            if future.get_overwrite_module_params_on_conversion() or \
                    future.get_swap_module_params_on_conversion():
                return original(self, fn, recurse)
            replaced = getattr(local, "replaced", None)
            outermost = replaced is None
            if outermost:
                replaced = local.replaced = {}
            try:
                if recurse:
                    for child in self.children():
                        child._apply(fn)
                _share_replacements(self, replaced)
                before = dict(self._parameters)
                original(self, fn, False)
                _keep_originals(self, before, replaced, kinds)
                return self
            finally:
                if outermost:
                    local.replaced = None

        return _apply

    patcher.wrap(torch.nn.Module, "_apply", make)


def _share_replacements(module: torch.nn.Module, replaced: dict) -> None:
    """Give ``module`` the Parameter that replaced one of its parameters earlier in the same
    move (a tied parameter whose original could not be kept)."""
    for key, param in module._parameters.items():
        entry = replaced.get(id(param)) if param is not None else None
        if entry is not None and entry[0] is param:
            module._parameters[key] = entry[1]


def _keep_originals(module: torch.nn.Module, before: dict, replaced: dict, kinds: tuple) -> None:
    """Where ``Module._apply`` put a new Parameter in ``module`` for a move CUDA makes in place
    (dense tensors between the host and the chip), move its contents into the original object
    instead; record each original that had to stay replaced."""
    for key, old in before.items():
        new = module._parameters.get(key)
        if old is None or new is None or new is old:
            continue
        if _in_place_on_cuda(old, new, kinds) and _swap_contents(old, new):
            module._parameters[key] = old
        else:
            replaced[id(old)] = (old, new)


def _in_place_on_cuda(old: torch.Tensor, new: torch.Tensor, kinds: tuple) -> bool:
    """Whether PyTorch on CUDA would have kept the Parameter: both dense, on the host or the chip."""
    return all(t.device.type in kinds and t.layout == torch.strided and not t.is_quantized
               and type(t) is type(old) for t in (old, new))


def _swap_contents(old: torch.nn.Parameter, new: torch.nn.Parameter) -> bool:
    """Give ``old`` the tensor (gradient included) of ``new`` and keep ``old``'s attributes;
    False, with nothing changed, where ``torch.utils.swap_tensors`` cannot: a weak reference,
    or another holder of either tensor (a live autograd graph, a C++ owner)."""
    if weakref.getweakrefs(old) or weakref.getweakrefs(new) \
            or old._use_count() != 1 or new._use_count() != 1:
        return False
    try:
        torch.utils.swap_tensors(old, new)
    except RuntimeError:
        return False
    old.__dict__, new.__dict__ = new.__dict__, old.__dict__
    return True


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
