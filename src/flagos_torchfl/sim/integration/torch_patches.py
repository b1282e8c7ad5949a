"""The few places where PyTorch's C++ side needs from a PrivateUse1 backend something a Python
backend cannot register, answered at the Python entry points instead.

A backend written in C++ registers an allocator, a device count and a caching-allocator
interface with c10; from Python only a device guard of fixed behaviour (device 0, one device) and
a few hooks can be registered. Left alone, that makes PyTorch

* dereference a null allocator (a segmentation fault) in ``torch.UntypedStorage(n, device=...)``,
  ``UntypedStorage.new()`` and so in ``storage.clone()``, ``copy.deepcopy`` of a tensor,
  ``storage.to(device)``;
* refuse ``UntypedStorage.resize_`` (which FSDP uses to free and restore parameter memory);
* run the backward pass of tensors on device index >= 1 into an autograd engine that made a
  worker queue for one device only (an internal assertion, then a crash at exit);
* answer ``torch.accelerator.synchronize``, ``current_device_index`` and the memory queries
  wrongly or with an internal assertion;
* refuse ``Tensor.record_stream`` with the device's own (Python) streams, which FSDP1 calls from
  its backward hooks, aborting the process;
* raise its internal ``PrivateUse1HooksInterface`` errors for ``torch.Generator("sim")`` and for
  pinned host memory (``Tensor.pin_memory()``, ``DataLoader(pin_memory=True)``), whose
  allocator and generator hooks only C++ can register.

Each patch changes behaviour only for sim devices and delegates everything else to PyTorch. The
patches are :data:`PATCHES`, applied in that order by :func:`apply` through a
:class:`~flagos_torchfl.patching.Patcher`, the recorder of every change this package makes to
torch. They last as long as the sim's claim of PrivateUse1, which cannot be undone: for the
process, not for one activation (``ft.deactivate()`` leaves them, as it leaves ``torch.sim``);
:func:`undo` takes them back exactly, for tests.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import torch
import torch.autograd.variable

from ...patching import Patcher, generator_class
from ...registrations import keep_at_exit
from ..runtime import state, tensors


class Needs(NamedTuple):
    """What the installed sim is: its device count and whether its C++ runtime is registered."""

    num_devices: int
    cpp: bool


_patcher: Patcher | None = None
_applied: list[str] = []


def apply(num_devices: int, cpp: bool = False) -> None:
    """Apply the :data:`PATCHES` the sim needs, in order (once per process: the sim is installed
    once). ``cpp``: the C++ runtime is registered, so PyTorch's autograd engine,
    ``torch.accelerator``'s device and stream calls and pinned memory reach its guard and hooks,
    and only what it leaves to Python is patched. A patch that raises leaves torch as it was."""
    global _patcher
    if _patcher is not None:
        return
    needs, patcher = Needs(num_devices, cpp), Patcher()
    try:
        for name, needed, change in PATCHES:
            if needed(needs):
                change(needs, patcher)
                _applied.append(name)
    except BaseException:
        _applied.clear()
        patcher.undo()
        raise
    _patcher = patcher


def applied() -> list[str]:
    """The names of the patches in force, in the order they were applied."""
    return list(_applied)


def undo() -> None:
    """Take every patch back, newest first (the sim's devices stay claimed)."""
    global _patcher
    if _patcher is not None:
        patcher, _patcher = _patcher, None
        _applied.clear()
        patcher.undo()


# -- storages ----------------------------------------------------------------------------------
def _sim_index(device: Any) -> int | None:
    if isinstance(device, (str, torch.device)):
        device = torch.device(device)
        if device.type == state.DEVICE_TYPE:
            return state.to_index(device)
    return None


def storage(needs: Needs, patcher: Patcher) -> None:
    """``torch.UntypedStorage(n, device="sim")``, ``UntypedStorage.new()`` and ``resize_`` of a
    sim storage: memory from the sim's allocator (PyTorch would dereference the null allocator of a
    backend without one registered in C++, or refuse to resize)."""
    cls = torch.UntypedStorage
    base_new = torch._C.StorageBase.__new__

    def __new__(klass, *args, **kwargs):
        index = _sim_index(kwargs.get("device"))
        if index is None or klass is not cls:
            return base_new(klass, *args, **kwargs)
        if not args:
            return tensors.new_storage(0, index)
        if len(args) == 1 and isinstance(args[0], int):
            return tensors.new_storage(args[0], index)
        host = base_new(klass, *args, **{k: v for k, v in kwargs.items() if k != "device"})
        return tensors.copy_storage_to_sim(host, index)

    def new(original):
        @functools.wraps(original)
        def new(self):
            if tensors.is_sim_storage(self):
                return tensors.new_storage(0, self.device.index)
            return original(self)
        return new

    def resize(original):
        @functools.wraps(original)
        def resize_(self, size):
            if tensors.is_sim_storage(self):
                tensors.resize_storage(self, int(size))
                return self
            return original(self, size)
        return resize_

    patcher.setattr(cls, "__new__", staticmethod(__new__))
    patcher.wrap(cls, "new", new)
    patcher.wrap(cls, "resize_", resize)


# -- autograd ----------------------------------------------------------------------------------
class _CallingThreadEngine:
    """PyTorch's autograd engine, run with its per-device worker threads disabled: the backward
    pass runs in the thread that asked for it (where sim kernels run anyway), so the engine never
    looks up a worker queue for a sim device index it did not create."""

    def __init__(self, engine: Any):
        self._engine = engine

    def run_backward(self, *args, **kwargs):
        with torch.autograd.set_multithreading_enabled(False):
            return self._engine.run_backward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def autograd_engine(needs: Needs, patcher: Patcher) -> None:
    """The backward pass runs in the calling thread (Python guard, several devices): PyTorch's
    engine made a worker queue for one device only."""
    variable = torch.autograd.variable.Variable
    patcher.setattr(variable, "_execution_engine", _CallingThreadEngine(variable._execution_engine))


# -- torch.accelerator -------------------------------------------------------------------------
def _sim_is_accelerator() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == state.DEVICE_TYPE


def _synchronize(device: Any = None, /) -> None:
    state.to_index(device)  # sim work runs inline: validating the device is all there is to do


def _set_device_index(device: Any, /) -> None:
    state.set_current_device(state.to_index(device))


def _empty_cache() -> None:
    for alloc in state.allocators():
        alloc.empty_cache()


def _memory_info(device_index: Any = None, /) -> tuple[int, int]:
    alloc = state.allocator(state.to_index(device_index))
    return max(alloc.capacity - alloc.reserved, 0), alloc.capacity


def _allocator_query(method: Callable[[Any], Any]) -> Callable[..., Any]:
    def query(device_index: Any = None, /) -> Any:
        return method(state.allocator(state.to_index(device_index)))

    return query


_DEVICE_IMPLS: dict[str, Callable[..., Any]] = {
    "synchronize": _synchronize,
    "current_device_index": state.current_device,
    "set_device_index": _set_device_index,
}
_MEMORY_IMPLS: dict[str, Callable[..., Any]] = {
    "empty_cache": _empty_cache,
    "get_memory_info": _memory_info,
    "memory_stats": _allocator_query(lambda a: a.stats()),
    "memory_allocated": _allocator_query(lambda a: a.allocated),
    "max_memory_allocated": _allocator_query(lambda a: a.max_allocated),
    "memory_reserved": _allocator_query(lambda a: a.reserved),
    "max_memory_reserved": _allocator_query(lambda a: a.max_reserved),
    "reset_peak_memory_stats": _allocator_query(lambda a: a.reset_peak()),
    "reset_accumulated_memory_stats": _allocator_query(lambda a: a.reset_accumulated()),
}
_ALIASES = {"current_device_idx": "current_device_index", "set_device_idx": "set_device_index"}


def accelerator(needs: Needs, patcher: Patcher) -> None:
    """``torch.accelerator``'s memory queries (and, with the Python guard, its device calls)
    answered by the sim's state and allocators while the sim is the current accelerator."""
    import torch.accelerator.memory as accel_memory

    impls = _MEMORY_IMPLS if needs.cpp else {**_DEVICE_IMPLS, **_MEMORY_IMPLS}
    for module in (torch.accelerator, accel_memory):
        for name, impl in impls.items():
            if getattr(module, name, None) is not None:
                patcher.wrap(module, name, lambda original, impl=impl: _dispatching(original, impl))
        for alias, target in _ALIASES.items():
            if hasattr(module, alias) and target in impls:
                patcher.setattr(module, alias, getattr(module, target))


def _dispatching(original: Callable, impl: Callable) -> Callable:
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _sim_is_accelerator():
            return impl(*args, **kwargs)
        return original(*args, **kwargs)

    wrapper.__flagos_sim_original__ = original
    return wrapper


# -- generators, streams and pinned memory ------------------------------------------------------
def generator(needs: Needs, patcher: Patcher) -> None:
    """``torch.Generator("sim"[:N])``: a new :class:`state.SimGenerator` of that device."""
    original = torch.Generator

    def new(device="cpu"):
        index = _sim_index(device)
        if index is not None:
            return state.SimGenerator(index)
        return original(device=device)

    patcher.setattr(torch, "Generator", generator_class(original, new))


def record_stream(needs: Needs, patcher: Patcher) -> None:
    """``Tensor.record_stream(stream)`` on a sim tensor does nothing: the sim runs all work
    inline, so no other stream can still be using the tensor's memory when it is freed."""
    def wrap(original):
        @functools.wraps(original)
        def record_stream(self, stream):
            if self.device.type == state.DEVICE_TYPE:
                return None
            return original(self, stream)
        return record_stream

    patcher.wrap(torch.Tensor, "record_stream", wrap)


def pinned_memory(needs: Needs, patcher: Patcher) -> None:
    """``Tensor.pin_memory()`` and ``is_pinned()`` for host tensors (Python guard): pinning copies
    the tensor into fresh host memory marked pinned (the sim's transfers are host copies, so pinned
    memory is ordinary memory that says so), and ``is_pinned`` reads the mark."""
    held: list[torch.library.Library] = []

    def _pin_memory(self, device=None):
        out = torch.empty_like(self, memory_format=torch.contiguous_format).copy_(self)
        out.untyped_storage()._fl_pinned = True
        return out

    def is_pinned(self, device=None):
        return bool(getattr(self.untyped_storage(), "_fl_pinned", False))

    def register() -> None:
        library = keep_at_exit(torch.library.Library("aten", "IMPL"))
        library.impl("_pin_memory", _pin_memory, "CPU")
        library.impl("is_pinned", is_pinned, "CPU")
        held.append(library)

    patcher.call(register, lambda: held.pop()._destroy(), "pinned_memory")


def _always(needs: Needs) -> bool:
    return True


#: the sim's patches of torch, in the order :func:`apply` applies them: name, whether the installed
#: sim needs it, the change
PATCHES: tuple[tuple[str, Callable[[Needs], bool], Callable[[Needs, Patcher], None]], ...] = (
    ("sim_storage", _always, storage),
    ("sim_autograd_engine", lambda needs: needs.num_devices > 1 and not needs.cpp, autograd_engine),
    ("sim_accelerator", _always, accelerator),
    ("sim_generator", _always, generator),
    ("sim_record_stream", _always, record_stream),
    ("sim_pinned_memory", lambda needs: not needs.cpp, pinned_memory),
)
