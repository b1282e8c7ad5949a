"""The ``torch.cuda`` facade: ``torch.cuda.*`` answered by the active backend.

While active, the ``torch.cuda`` module object gets a ModuleType subclass whose attribute
lookup answers from :class:`CudaFacade` (no attribute of the module is rewritten, so undoing is
giving the module its class back). Rules for ``torch.cuda.<name>``:

* a served name (the table in :meth:`CudaFacade.served`) answers for the backend;
* a private name (``_lazy_init``, ``_is_compiled``...) reaches the real module unchanged, since
  torch's own code uses them — except ``_record_memory_history``-style profiling hooks, which
  are unserved stand-ins (below);
* any other public name is delegated to the backend's device module when it has one of that
  name (``torch.npu.utilization``...; its device arguments pass unchanged), and otherwise is an
  unserved stand-in (:mod:`.standins`) that raises on use, naming the attribute and the backend.

The answers come from the chip's device module (for the CPU the host runtime of
:mod:`flagos_torchfl.machine.host`: streams run work inline, events record host time, memory
counters give the process's resident memory, ``mem_get_info`` reads host memory, ``torch.cuda.manual_seed`` seeds the CPU
generator). The CUDA RNG stream itself is not reproduced on another chip: a seeded script is
deterministic on each backend, with numbers of that backend's generator.

This module holds the module classes and the three patches; :mod:`.cuda_facade` the answers.

``torch.accelerator`` and ``torch.get_device_module()`` are not touched: they report the real
backend (on the CPU backend, no accelerator).
"""
from __future__ import annotations

import sys
import types
from typing import Any, Dict

import torch

from .. import compat
from ..tables.device_modules import missing_uses
from .cuda_facade import LEGACY_TYPES, PASS, CudaFacade
from .devices import Target
from ..patching import Patcher
from .patches import patch_function
from .standins import unserved

_active: Dict[str, Any] = {"facade": None, "backends_cuda": None}


def active_facade() -> Any:
    """The :class:`~.cuda_facade.CudaFacade` answering ``torch.cuda`` now (None when inactive)."""
    return _active["facade"]


class _FacadeModule(types.ModuleType):
    """The class ``torch.cuda`` wears while the facade is active."""

    def __getattribute__(self, name):
        facade = _active["facade"]
        if facade is not None:
            value = facade.lookup(name)
            if value is not PASS:
                return value
        return types.ModuleType.__getattribute__(self, name)


class _BackendsCudaModule(types.ModuleType):
    """The class ``torch.backends.cuda`` wears: flags pass, CUDA-only objects are stand-ins."""

    DENIED = frozenset({"cufft_plan_cache", "preferred_blas_library", "preferred_rocm_fa_library"})

    def __getattribute__(self, name):
        stand_ins = _active["backends_cuda"]
        if stand_ins is not None and name in stand_ins:
            return stand_ins[name]
        return types.ModuleType.__getattribute__(self, name)


@patch_function("torch_cuda", on_cuda=True)
def patch_torch_cuda(target: Target, patcher: Patcher) -> None:
    """``torch.cuda.*`` answered by the backend (a class swap on the module; see module doc)."""
    cuda = torch.cuda
    facade = CudaFacade(target, cuda, target.cuda_kernel_packages)
    patcher.setitem(_active, "facade", facade)
    patcher.setattr(missing_uses, "counts", {})  # this activation's uses only; undo drops them
    patcher.set_module_class(cuda, _FacadeModule)


class _SameKind(type):
    """``isinstance``/``issubclass`` answer as for the classes a replacement stands for
    (``_kinds``: the class it replaces, and the inline class it makes on the host), so every real
    stream and event still passes ``isinstance(s, torch.Stream)``."""

    def __instancecheck__(cls, instance):
        return isinstance(instance, cls._kinds)

    def __subclasscheck__(cls, subclass):
        return issubclass(subclass, cls._kinds)


def _device_class(original: type, target: Target, inline: Any) -> type:
    """``original`` (``torch.Stream`` / ``torch.Event``) taking ``device="cuda[:N]"`` for the
    backend's device: a real ``original`` of the translated device, or, where the backend's
    streams run inline (the host), ``inline(...)``, the object ``torch.cuda`` makes for it. A
    device that does not name CUDA passes unchanged; subclasses made from it translate too."""

    def __new__(cls, *args, **kwargs):
        device = args[0] if args else kwargs.get("device")
        translated = target.translate(device) if device is not None else None
        if translated is not device:
            if args:
                args = (translated,) + args[1:]
            else:
                kwargs["device"] = translated
            if cls is replacement and inline is not None:
                return inline(**{k: v for k, v in kwargs.items() if k != "device"})
        if cls is replacement:
            return original(*args, **kwargs)
        return original.__new__(cls, *args, **kwargs)

    replacement = _SameKind(original.__name__, (original,), {
        "__new__": __new__, "_kinds": (original,) if inline is None else (original, inline),
        "__module__": original.__module__,
        "__qualname__": original.__qualname__, "__doc__": original.__doc__})
    return replacement


@patch_function("stream_event_devices", on_cuda=True)
def patch_stream_event_devices(target: Target, patcher: Patcher) -> None:
    """``torch.Stream(device="cuda")`` and ``torch.Event(device="cuda:0")``: a stream or event
    of the backend's device (on the cpu backend, whose device module has no events, the host's
    inline ones that ``torch.cuda.Stream`` / ``torch.cuda.Event`` make)."""
    if not compat.has("stream_event") or target.cuda_itself and not target.remaps:
        return
    facade = _active["facade"]
    inline = facade.inline_streams() if facade is not None else None
    patcher.setattr(torch, "Stream", _device_class(torch.Stream, target, getattr(inline, "Stream", None)))
    patcher.setattr(torch, "Event", _device_class(torch.Event, target, getattr(inline, "Event", None)))


@patch_function("torch_backends_cuda")
def patch_backends_cuda(target: Target, patcher: Patcher) -> None:
    """``torch.backends.cuda`` / ``torch.backends.cudnn`` flags (``benchmark``,
    ``deterministic``, ``matmul.allow_tf32``, sdp switches) keep working as plain flags;
    CUDA-only objects (``cufft_plan_cache``, BLAS library choice) raise on use, naming the backend."""
    module = torch.backends.cuda
    stand_ins: Dict[str, Any] = {n: unserved(n, target, "torch.backends.cuda") for n in _BackendsCudaModule.DENIED}
    stand_ins["is_built"] = _is_built(types.ModuleType.__getattribute__(module, "is_built"))
    patcher.setitem(_active, "backends_cuda", stand_ins)
    patcher.set_module_class(module, _BackendsCudaModule)


def _is_built(real: Any) -> Any:
    """``torch.backends.cuda.is_built()``: True for the program, as ``torch.cuda.is_available()``
    is (a program that checks both takes the device path). torch's own modules (Inductor's
    cudagraph trees, ``torch.cuda.streams``) and the packages that load CUDA kernels are told
    the truth: they would call CUDA-only functions next."""

    def is_built(_frame: Any = sys._getframe) -> bool:
        caller = _frame(1).f_globals.get("__name__") or ""
        facade = _active["facade"]
        if caller.partition(".")[0] == "torch" or (facade is not None and facade.loads_cuda_kernels(caller)):
            return real()
        return True

    is_built.__doc__ = real.__doc__
    return is_built


@patch_function("legacy_tensor_type")
def patch_tensor_type(target: Target, patcher: Patcher) -> None:
    """``x.type(torch.cuda.FloatTensor)`` and ``x.type("torch.cuda.FloatTensor")``: the dtype
    on the target device; every other use of ``Tensor.type`` is the original."""
    original = torch.Tensor.type

    def type(self, dtype=None, non_blocking=False, **kwargs):
        name = None
        if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
            name = dtype[len("torch.cuda."):]
        elif dtype is not None and getattr(dtype, "__module__", None) == "torch.cuda":
            name = getattr(dtype, "__name__", None)
        if name in LEGACY_TYPES:
            return self.to(target.translate("cuda"), LEGACY_TYPES[name], non_blocking=non_blocking)
        return original(self, dtype, non_blocking, **kwargs)

    type.__doc__ = original.__doc__
    patcher.setattr(torch.Tensor, "type", type)
