"""Sim storages and tensors, and the CPU views of their bytes.

A sim storage is an ordinary PyTorch storage on the PrivateUse1 device whose data pointer is the
host address of a block from the device's :class:`~flagos_torchfl.sim.runtime.allocator.CachingAllocator`
(``torch._C._construct_storage_from_data_pointer``). So ``storage.data_ptr()`` is real, readable
host memory, not a null pointer: any C++ code that reads it reads the right bytes instead of
crashing. The storage does not own the block; a small :class:`_Memory` record kept in the storage's
Python ``__dict__`` does, and gives the block back when the storage dies (PyTorch keeps a storage's
Python object, attributes included, alive exactly as long as the storage itself, whatever tensors,
views, ``detach()`` or ``nn.Parameter`` share it).

Sim tensors are made from a per-(device, dtype) empty template tensor (created through DLPack,
whose ``kDLExtDev`` devices map to PrivateUse1 with their index) by aliasing it below the
autograd and sim keys, then pointing the alias at the storage with the CPU kernel of
``aten::set_`` (the Meta kernel refuses storages that cannot grow, and sim storages cannot; the
CPU kernel only touches metadata, and the geometry is checked against the storage here first).

With the C++ runtime, sim storages are the C++ runtime's: their blocks come from its C++
allocators (:mod:`.cpp.allocator`), and a storage owns its block through its C++ deleter instead
of a ``_Memory`` record.

A *host view* is a CPU tensor over the same bytes with the same size, stride, offset and dtype;
the sim's kernels run PyTorch's CPU kernels on host views. A host view keeps the sim storage
alive; it stops seeing the tensor's bytes if the sim storage is later grown by ``resize_``.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Sequence

import torch

from . import state
from .allocator import Block, CachingAllocator

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_META_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_SET_STORAGE = torch.ops.aten.set_.source_Storage_storage_offset
_ALIAS = torch.ops.aten.alias.default
_VIEW_DTYPE = torch.ops.aten.view.dtype
_EMPTY = torch.ops.aten.empty.memory_format
_CPU = torch.device("cpu")

_templates: dict[tuple[int, torch.dtype], torch.Tensor] = {}


class _Memory:
    """Owner of a sim storage's block; returns the block to its allocator when collected."""

    __slots__ = ("block", "allocator")

    def __init__(self, block: Block | None, alloc: CachingAllocator):
        self.block = block
        self.allocator = alloc

    def __del__(self):
        block, self.block = self.block, None
        if block is not None and not sys.is_finalizing():
            self.allocator.free(block)


def new_storage(nbytes: int, index: int) -> torch.UntypedStorage:
    """A fresh sim storage of ``nbytes`` bytes on device ``index`` (contents undefined); the
    devices' first use (:func:`state.begin_use`)."""
    if state.cpp_runtime() is not None:
        state.check_index(index)
        return _EMPTY([nbytes], dtype=torch.uint8, device=torch.device(state.DEVICE_TYPE, index)).untyped_storage()
    state.begin_use()
    alloc = state.allocator(index)
    block = alloc.allocate(nbytes)
    ptr = 0 if block is None else block.ptr
    storage = torch._C._construct_storage_from_data_pointer(
        ptr, torch.device(state.DEVICE_TYPE, index), nbytes)
    storage._fl_memory = _Memory(block, alloc)
    return storage


def is_sim_storage(storage: torch.UntypedStorage) -> bool:
    """Whether ``storage`` is on a sim device (made by :func:`new_storage`, or by PyTorch from
    one, like a slice ``storage[a:b]``, which holds a reference to the storage it slices)."""
    return storage.device.type == state.DEVICE_TYPE


def owns_block(storage: torch.UntypedStorage) -> bool:
    """Whether ``storage`` holds its own block of the sim allocator (made by :func:`new_storage`)."""
    cpp_runtime = state.cpp_runtime()
    if cpp_runtime is not None:
        return cpp_runtime.owns_block(storage)
    return getattr(storage, "_fl_memory", None) is not None


def _check_storage(storage: torch.UntypedStorage) -> None:
    if not is_sim_storage(storage):
        raise RuntimeError(f"expected a storage on a sim device, got one on {storage.device}")
    if storage.nbytes() and not storage.data_ptr():
        raise RuntimeError(f"a {storage.device} storage of {storage.nbytes()} bytes has no memory "
                           "(it was not made by the sim allocator)")


# -- DLPack: the one way to get a fresh TensorImpl on PrivateUse1 with a chosen device index --
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_K_DL_EXT_DEV = 12
_K_DL_UINT = 1
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_anchor = torch.empty(64, dtype=torch.uint8, device="cpu")  # an address for empty templates


def _template(index: int, dtype: torch.dtype) -> torch.Tensor:
    key = (index, dtype)
    tpl = _templates.get(key)
    if tpl is None:
        shape = (ctypes.c_int64 * 1)(0)
        strides = (ctypes.c_int64 * 1)(1)
        managed = _DLManagedTensor()
        managed.dl_tensor.data = _anchor.data_ptr()
        managed.dl_tensor.device = _DLDevice(_K_DL_EXT_DEV, index)
        managed.dl_tensor.ndim = 1
        managed.dl_tensor.dtype = _DLDataType(_K_DL_UINT, 8, 1)
        managed.dl_tensor.shape = shape
        managed.dl_tensor.strides = strides
        managed.deleter = None
        # PyTorch reads ``managed.deleter`` when the template's storage dies, possibly during
        # interpreter shutdown: the record must outlive every Python object, so it is never freed.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(managed))
        raw = torch._C._from_dlpack(_capsule_new(ctypes.addressof(managed), b"dltensor", None))
        tpl = raw if dtype == torch.uint8 else _VIEW_DTYPE.redispatch(_META_KEYS, raw, dtype)
        _templates[key] = tpl
    return tpl


def storage_bytes_needed(size: Sequence[int], stride: Sequence[int], offset: int,
                         itemsize: int) -> int:
    """Bytes a storage needs to hold a tensor of this geometry (0 when it has no elements)."""
    if any(s == 0 for s in size):
        return 0
    last = offset + sum((s - 1) * st for s, st in zip(size, stride))
    return (last + 1) * itemsize


def contiguous_strides(size: Sequence[int]) -> list[int]:
    """Row-major strides for ``size``."""
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return strides[::-1]


def tensor_on(storage: torch.UntypedStorage, dtype: torch.dtype, size: Sequence[int],
              stride: Sequence[int], offset: int = 0) -> torch.Tensor:
    """A new sim tensor over ``storage`` (a sim storage) with the given geometry."""
    _check_storage(storage)
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    need = storage_bytes_needed(size, stride, offset, dtype.itemsize)
    if need > storage.nbytes():
        raise RuntimeError(
            f"sim: a {dtype} tensor of size {tuple(size)}, stride {tuple(stride)} and offset "
            f"{offset} needs {need} bytes but its storage has {storage.nbytes()}"
        )
    t = _ALIAS.redispatch(_META_KEYS, _template(storage.device.index, dtype))
    _SET_STORAGE.redispatch(_CPU_KEYS, t, storage, offset, size, stride)
    return t


def set_geometry(t: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int,
                 storage: torch.UntypedStorage | None = None) -> torch.Tensor:
    """Point sim tensor ``t`` (in place) at ``storage`` (default: its own) with this geometry."""
    storage = t.untyped_storage() if storage is None else storage
    _check_storage(storage)
    if storage.device != t.device:
        raise RuntimeError(
            f"cannot set the storage of a {t.device} tensor to a storage on {storage.device}"
        )
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    need = storage_bytes_needed(size, stride, offset, t.element_size())
    if need > storage.nbytes():
        raise RuntimeError(
            f"sim: size {tuple(size)}, stride {tuple(stride)}, offset {offset} needs {need} bytes "
            f"but the storage has {storage.nbytes()} (sim storages grow only through resize_)"
        )
    _SET_STORAGE.redispatch(_CPU_KEYS, t, storage, offset, size, stride)
    return t


def empty(size: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype,
          index: int) -> torch.Tensor:
    """A new sim tensor with fresh storage on device ``index`` (contents undefined)."""
    size = [int(s) for s in size]
    stride = contiguous_strides(size) if stride is None else [int(s) for s in stride]
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {tuple(size)}")
    storage = new_storage(storage_bytes_needed(size, stride, 0, dtype.itemsize), index)
    return tensor_on(storage, dtype, size, stride, 0)


def host_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A CPU storage over the bytes of sim ``storage`` that keeps ``storage`` alive."""
    _check_storage(storage)
    cpu = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), _CPU, storage.nbytes())
    cpu._fl_owner = storage
    return cpu


def host_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor aliasing the bytes of sim tensor ``t``: same dtype, size, stride and offset."""
    if not isinstance(t, torch.Tensor) or t.device.type != state.DEVICE_TYPE:
        raise TypeError(f"host_view expects a sim tensor, got {_describe(t)}")
    view = _EMPTY([0], dtype=t.dtype, device=_CPU)
    view.set_(host_storage(t.untyped_storage()), t.storage_offset(), t.size(), t.stride())
    return view


def copy_storage_to_sim(source: torch.UntypedStorage, index: int) -> torch.UntypedStorage:
    """A new sim storage on device ``index`` with a byte copy of ``source`` (CPU or sim)."""
    storage = new_storage(source.nbytes(), index)
    copy_storage_bytes(storage, source, source.nbytes())
    return storage


def copy_storage_bytes(dst: torch.UntypedStorage, src: torch.UntypedStorage, nbytes: int) -> None:
    """Copy the first ``nbytes`` bytes of ``src`` into ``dst`` (either may be sim or CPU)."""
    if nbytes:
        dst_cpu = host_storage(dst) if is_sim_storage(dst) else dst
        src_cpu = host_storage(src) if is_sim_storage(src) else src
        _bytes(dst_cpu, nbytes).copy_(_bytes(src_cpu, nbytes))


def grow_storage(storage: torch.UntypedStorage, nbytes: int) -> None:
    """Grow sim ``storage`` in place to at least ``nbytes`` bytes (see :func:`resize_storage`)."""
    if nbytes > storage.nbytes():
        resize_storage(storage, nbytes)


def resize_storage(storage: torch.UntypedStorage, nbytes: int) -> None:
    """Give sim ``storage`` a new block of ``nbytes`` bytes in place, keeping the leading bytes
    both sizes have: every tensor sharing the storage sees the new memory, and the old block goes
    back to the cache."""
    _check_storage(storage)
    if not owns_block(storage):
        raise RuntimeError("cannot resize a sim storage that is a view of another storage "
                           "(e.g. a slice)")
    old = storage.nbytes()
    if nbytes == old:
        return
    if nbytes < 0:
        raise RuntimeError(f"cannot resize a storage to {nbytes} bytes")
    cpp_runtime = state.cpp_runtime()
    if cpp_runtime is not None:
        cpp_runtime.resize_storage(storage, nbytes)
        return
    index = storage.device.index
    fresh = new_storage(nbytes, index)
    copy_storage_bytes(fresh, storage, min(old, nbytes))
    parked = new_storage(0, index)
    if old:  # _swap_data_ptr_ needs equal sizes or one side empty: go through an empty storage
        storage._swap_data_ptr_(parked)
    if nbytes:
        storage._swap_data_ptr_(fresh)
    mine = storage._fl_memory
    parked._fl_memory.block = mine.block  # the old block, freed when ``parked`` goes
    mine.block, fresh._fl_memory.block = fresh._fl_memory.block, None


def _bytes(cpu_storage: torch.UntypedStorage, nbytes: int) -> torch.Tensor:
    view = _EMPTY([0], dtype=torch.uint8, device=_CPU)
    view.set_(cpu_storage, 0, [nbytes], [1])
    return view


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.device} tensor"
    return type(x).__name__
