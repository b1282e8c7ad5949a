"""The C++ runtime's caching allocator (``allocator.h``), held from Python.

:class:`CppCachingAllocator` has the interface of the Python runtime's
:class:`~flagos_torchfl.sim.runtime.allocator.CachingAllocator` and the same policy (that module's
docstring), so the device module, graphs and memory statistics ask either alike. With the C++
runtime every sim allocation and release happens in C++ (the C++ runtime calls the allocator
directly, and it tells a profiler that records memory itself); Python only configures it and
reads its statistics, through the ``fl_sim_alloc_*`` C functions.
"""
from __future__ import annotations

import contextlib
import ctypes
from typing import Callable, Iterator

from ..allocator import (NOMINAL_TOTAL_MEMORY, STAT_FIELDS, STAT_GROUPS, STAT_NAMES, check_fraction,
                         memory_stats)

_VALUES = len(STAT_NAMES) * len(STAT_GROUPS) * len(STAT_FIELDS) + 2
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


def declare(library: ctypes.CDLL) -> None:
    """Give ``library``'s ``fl_sim_alloc_*`` functions their C signatures."""
    signatures = {
        "new": ([ctypes.c_int, _I64, ctypes.c_char_p], _PTR),
        "delete": ([_PTR], None),
        "error": ([], ctypes.c_char_p),
        "take": ([_PTR, _I64, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_I64)], ctypes.c_int),
        "give": ([_PTR, ctypes.c_uint64], ctypes.c_int),
        "empty_cache": ([_PTR], _I64),
        "limit": ([_PTR], _I64),
        "set_limit": ([_PTR, _I64], None),
        "fraction": ([_PTR], ctypes.c_double),
        "set_fraction": ([_PTR, ctypes.c_double], None),
        "allocated": ([_PTR], _I64),
        "reserved": ([_PTR], _I64),
        "stats": ([_PTR, ctypes.POINTER(_I64)], None),
        "stat_values": ([], ctypes.c_int),
        "reset": ([_PTR, ctypes.c_int], None),
        "retain_pool": ([_PTR, _I64, _I64], None),
        "release_pool": ([_PTR, _I64, _I64], ctypes.c_int),
        "enter": ([_PTR, _I64, _I64], ctypes.c_int),
        "leave": ([_PTR], None),
        "pool_reserved": ([_PTR, _I64, _I64], _I64),
    }
    for name, (args, result) in signatures.items():
        function = getattr(library, f"fl_sim_alloc_{name}")
        function.argtypes, function.restype = args, result
    if library.fl_sim_alloc_stat_values() != _VALUES:
        raise RuntimeError(f"the C++ allocator writes {library.fl_sim_alloc_stat_values()} statistics, "
                           f"this module reads {_VALUES}")


class CppBlock:
    """A block handed out by :meth:`CppCachingAllocator.allocate`: ``size`` bytes at ``ptr``."""

    __slots__ = ("ptr", "size")

    def __init__(self, ptr: int, size: int):
        self.ptr, self.size = ptr, size

    def __repr__(self) -> str:
        return f"Block(ptr=0x{self.ptr:x}, size={self.size})"


class CppCachingAllocator:
    """The C++ caching allocator of one sim device (``library``: the loaded C++ runtime, its
    functions declared by :func:`declare`)."""

    def __init__(self, library: ctypes.CDLL, device_index: int, limit: int | None = None,
                 device_name: Callable[[int], str] | None = None):
        self.device_index = device_index
        self._lib = library
        self._name = (device_name or (lambda i: f"sim:{i}"))(device_index)
        self._handle = library.fl_sim_alloc_new(device_index, -1 if limit is None else limit, self._name.encode())
        self._held = False

    @property
    def handle(self) -> int:
        """The C++ allocator's address; once asked for, a device holds it and it lives as long as
        the process."""
        self._held = True
        return self._handle

    def __del__(self):
        if not self._held and self._handle:
            self._lib.fl_sim_alloc_delete(self._handle)
            self._handle = None

    # -- configuration ----------------------------------------------------------------------
    @property
    def limit(self) -> int | None:
        """The memory limit in bytes, or None when the nominal capacity applies."""
        limit = self._lib.fl_sim_alloc_limit(self._handle)
        return None if limit < 0 else limit

    def set_limit(self, limit: int | None) -> None:
        """Set (or with None, lift) the limit; live blocks above a lowered limit stay valid."""
        self._lib.fl_sim_alloc_set_limit(self._handle, -1 if limit is None else limit)

    @property
    def capacity(self) -> int:
        """Total bytes of the device: the limit if set, else the nominal 16 GiB."""
        limit = self.limit
        return NOMINAL_TOTAL_MEMORY if limit is None else limit

    @property
    def fraction(self) -> float:
        """The share of :attr:`capacity` this process may reserve (1.0 unless set)."""
        return self._lib.fl_sim_alloc_fraction(self._handle)

    def set_fraction(self, fraction: float) -> None:
        """As ``torch.cuda.set_per_process_memory_fraction``: a new segment past the share fails
        with ``torch.OutOfMemoryError``."""
        check_fraction(fraction)
        self._lib.fl_sim_alloc_set_fraction(self._handle, fraction)

    @property
    def allowed(self) -> int:
        """Bytes this process may reserve: the capacity times :attr:`fraction`."""
        return int(self.capacity * self.fraction)

    # -- allocation -------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> CppBlock | None:
        """A block of at least ``nbytes`` bytes (None for 0); raises ``torch.OutOfMemoryError``."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes ({nbytes})")
        ptr, size = ctypes.c_uint64(), ctypes.c_int64()
        status = self._lib.fl_sim_alloc_take(self._handle, nbytes, ctypes.byref(ptr), ctypes.byref(size))
        if status:
            import torch

            message = self._lib.fl_sim_alloc_error().decode(errors="replace")
            raise (torch.OutOfMemoryError if status == 1 else RuntimeError)(message)
        return CppBlock(ptr.value, size.value) if ptr.value else None

    def free(self, block: CppBlock) -> None:
        """Return ``block`` to the cache (it stays reserved until :meth:`empty_cache`)."""
        if self._lib.fl_sim_alloc_give(self._handle, block.ptr):
            raise RuntimeError(f"double free of {block!r} on {self._name} (no live block starts there)")

    def empty_cache(self) -> int:
        """Give every wholly free segment back to the host; returns the bytes released."""
        return self._lib.fl_sim_alloc_empty_cache(self._handle)

    # -- graph pools --------------------------------------------------------------------------
    def retain_pool(self, token: tuple) -> None:
        """A graph begins to use the pool ``token`` (two integers; made at its first use)."""
        self._lib.fl_sim_alloc_retain_pool(self._handle, *_pair(token))

    def release_pool(self, token: tuple) -> None:
        """A graph stops using the pool ``token``; with no graph left, :meth:`empty_cache`
        gives the pool's free segments back to the host."""
        if self._lib.fl_sim_alloc_release_pool(self._handle, *_pair(token)):
            raise RuntimeError(f"graph pool {token} of {self._name} is not in use")

    @contextlib.contextmanager
    def allocating_to(self, token: tuple) -> Iterator[None]:
        """Within the block, the calling thread's requests take memory of the pool ``token``
        (which a graph must be using)."""
        if self._lib.fl_sim_alloc_enter(self._handle, *_pair(token)):
            raise RuntimeError(f"graph pool {token} of {self._name} is not in use")
        try:
            yield
        finally:
            self._lib.fl_sim_alloc_leave(self._handle)

    def pool_reserved(self, token: tuple) -> int:
        """Bytes of the segments of the pool ``token``."""
        return self._lib.fl_sim_alloc_pool_reserved(self._handle, *_pair(token))

    # -- statistics -------------------------------------------------------------------------
    def _values(self) -> list[int]:
        values = (ctypes.c_int64 * _VALUES)()
        self._lib.fl_sim_alloc_stats(self._handle, values)
        return list(values)

    def _stat(self, name: str, field: str) -> int:
        at = (STAT_NAMES.index(name) * len(STAT_GROUPS)) * len(STAT_FIELDS) + STAT_FIELDS.index(field)
        return self._values()[at]

    @property
    def allocated(self) -> int:
        """Bytes in live blocks."""
        return self._lib.fl_sim_alloc_allocated(self._handle)

    @property
    def reserved(self) -> int:
        """Bytes held from the host (live blocks plus the cache)."""
        return self._lib.fl_sim_alloc_reserved(self._handle)

    @property
    def max_allocated(self) -> int:
        """Peak of :attr:`allocated` since start or the last peak reset."""
        return self._stat("allocated_bytes", "peak")

    @property
    def max_reserved(self) -> int:
        """Peak of :attr:`reserved` since start or the last peak reset."""
        return self._stat("reserved_bytes", "peak")

    @property
    def num_alloc_retries(self) -> int:
        """How often a new segment needed the cache emptied first."""
        return self._values()[-2]

    @property
    def num_ooms(self) -> int:
        """How many requests failed with ``torch.OutOfMemoryError``."""
        return self._values()[-1]

    def stats(self):
        """All statistics, keyed as ``torch.cuda.memory_stats`` keys them, sorted by key."""
        values = self._values()
        return memory_stats(values[:-2], values[-2], values[-1])

    def reset_peak(self) -> None:
        """Set every peak to its current value."""
        self._lib.fl_sim_alloc_reset(self._handle, 0)

    def reset_accumulated(self) -> None:
        """Zero the cumulative counters (allocated/freed totals, retries, OOMs)."""
        self._lib.fl_sim_alloc_reset(self._handle, 1)


def _pair(token: tuple) -> tuple[int, int]:
    first, second = token
    return int(first), int(second)
