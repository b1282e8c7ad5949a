"""The sim device's caching allocator: host memory that stands for device memory.

One :class:`CachingAllocator` per sim device. Memory is reserved from the host in *segments*
(each a private CPU byte buffer that no CPU tensor of the user's sees) and handed out as
*blocks* carved from segments, in the manner of CUDA's caching allocator:

* a request of ``n`` bytes is rounded up to a multiple of :data:`BLOCK_ROUND` (512); a request of
  0 bytes gets no block at all (a null pointer, as on CUDA);
* requests up to :data:`SMALL_REQUEST` (1 MiB) come from the small pool, whose segments are
  :data:`SMALL_SEGMENT` (2 MiB) each; larger requests come from the large pool, whose segments are
  exactly as large as the request that created them;
* a request takes the best-fitting cached free block of its pool (the smallest that is large
  enough; among equal ones, the one in the oldest segment, then the lowest address: so the
  choice, and every statistic after it, does not depend on where the host placed the segments)
  and splits off the remainder, which stays cached; so the
  allocated bytes are always exactly the sum of the rounded sizes of the live blocks;
* a freed block merges with free neighbours of its segment and stays cached (reserved);
  :meth:`CachingAllocator.empty_cache` gives every wholly free segment back to the host;
* the device's capacity is the memory limit when one is set, else :data:`NOMINAL_TOTAL_MEMORY`
  (16 GiB). A new segment that would push the reserved bytes past the capacity first empties the
  cache and retries (counted in ``num_alloc_retries``); when it still does not fit, the request
  fails with :class:`torch.OutOfMemoryError` (counted in ``num_ooms``). A small-pool segment is
  shortened to what the capacity leaves when the full 2 MiB would not fit.

*Private pools* hold the memory of device graphs, as CUDA's graph pools do: while a thread
allocates to a pool (:meth:`CachingAllocator.allocating_to`, around each call a graph capture
records), its requests are carved from segments of that pool only, and blocks freed there go back
to it; no other request is given a pool's memory. A pool lives while a graph uses it
(:meth:`CachingAllocator.retain_pool` / :meth:`CachingAllocator.release_pool`, by its token:
graphs sharing a token share the memory, and one graph's freed blocks serve the next capture);
once none does, :meth:`CachingAllocator.empty_cache` gives its free segments back to the host.
Its blocks and segments count in every statistic, as CUDA counts a graph pool's.

Statistics follow ``torch.cuda.memory_stats`` naming (``allocated_bytes.all.current`` ...).
The allocator is safe to call from several threads and from a finalizer that fires while it is
busy (such frees are queued and applied before the busy call returns).

This is the Python runtime's allocator; the C++ runtime's is the same policy in C++
(``cpp/allocator.h``, held from Python by :class:`.cpp.allocator.CppCachingAllocator`, which has
this class's interface), so that its allocations never enter Python.
"""
from __future__ import annotations

import bisect
import collections
import contextlib
import logging
import threading
from typing import Callable, Iterator

import torch

logger = logging.getLogger("flagos_torchfl.sim")

BLOCK_ROUND = 512
SMALL_REQUEST = 1 << 20
SMALL_SEGMENT = 2 << 20
NOMINAL_TOTAL_MEMORY = 16 << 30

_POOLS = ("small_pool", "large_pool")
STAT_GROUPS = ("all",) + _POOLS
STAT_NAMES = ("allocation", "segment", "allocated_bytes", "reserved_bytes", "requested_bytes")
STAT_FIELDS = ("current", "peak", "allocated", "freed")


def round_size(nbytes: int) -> int:
    """The block size a request of ``nbytes`` occupies (0 for 0)."""
    return -(-nbytes // BLOCK_ROUND) * BLOCK_ROUND


def format_size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps it above 1 (e.g. ``'1.50 MiB'``)."""
    value = float(nbytes)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def check_fraction(fraction: object) -> None:
    """Refuse what ``torch.cuda.set_per_process_memory_fraction`` refuses, with its messages."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")


def memory_stats(values: list[int], retries: int, ooms: int) -> collections.OrderedDict[str, int]:
    """The ``torch.cuda.memory_stats`` table, sorted by key, of an allocator's statistics:
    ``values`` holds each of :data:`STAT_NAMES` x :data:`STAT_GROUPS` x :data:`STAT_FIELDS` in
    that order (``active`` is ``allocation`` and ``active_bytes`` is ``allocated_bytes``: no
    block waits on a stream)."""
    out: dict[str, int] = {}
    at = iter(values)
    for name in STAT_NAMES:
        for group in STAT_GROUPS:
            for field in STAT_FIELDS:
                value = next(at)
                out[f"{name}.{group}.{field}"] = value
                if name == "allocation":
                    out[f"active.{group}.{field}"] = value
                elif name == "allocated_bytes":
                    out[f"active_bytes.{group}.{field}"] = value
    out["num_alloc_retries"] = retries
    out["num_ooms"] = ooms
    out["num_device_alloc"] = out["segment.all.allocated"]
    out["num_device_free"] = out["segment.all.freed"]
    out["num_sync_all_streams"] = 0
    out["max_split_size"] = -1
    return collections.OrderedDict(sorted(out.items()))


class _Segment:
    """A host buffer reserved for the device; owns the bytes of the blocks carved from it.
    ``private``: the token of the graph pool it belongs to (None: the device's own pools)."""

    __slots__ = ("buffer", "ptr", "size", "pool", "blocks", "private", "serial")

    def __init__(self, size: int, pool: str, private: tuple | None, serial: int):
        self.buffer = torch.empty(size, dtype=torch.uint8, device="cpu")
        self.serial = serial  # its allocator's segments are numbered in the order they were made
        self.ptr = self.buffer.data_ptr()
        self.size = size
        self.pool = pool
        self.blocks = 0
        self.private = private

    @property
    def free_list(self) -> tuple:
        """The key of the free list its free blocks go to."""
        return self.private, self.pool


class Block:
    """A piece of a segment: ``size`` bytes at host address ``ptr``, ``requested`` of them
    asked for."""

    __slots__ = ("segment", "ptr", "size", "requested", "free", "prev", "next", "__weakref__")

    def __init__(self, segment: _Segment, ptr: int, size: int):
        self.segment = segment
        self.ptr = ptr
        self.size = size
        self.requested = 0
        self.free = True
        self.prev: Block | None = None
        self.next: Block | None = None

    def __repr__(self) -> str:
        state = "free" if self.free else "allocated"
        return f"Block(ptr=0x{self.ptr:x}, size={self.size}, {state})"


class _Stat:
    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, amount: int) -> None:
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    def decrease(self, amount: int) -> None:
        self.current -= amount
        self.freed += amount


class _BlockStats:
    """The three statistics a live block counts in one group (``all`` or its size pool): the
    allocations, their rounded bytes and their requested bytes, changed together."""

    __slots__ = ("allocation", "allocated_bytes", "requested_bytes")

    def __init__(self, stats: dict, group: str):
        self.allocation = stats["allocation"][group]
        self.allocated_bytes = stats["allocated_bytes"][group]
        self.requested_bytes = stats["requested_bytes"][group]

    def add(self, size: int, requested: int) -> None:
        """A block of ``size`` bytes, ``requested`` of them asked for, is handed out."""
        self.allocation.increase(1)
        self.allocated_bytes.increase(size)
        self.requested_bytes.increase(requested)

    def remove(self, size: int, requested: int) -> None:
        """Such a block is given back."""
        self.allocation.decrease(1)
        self.allocated_bytes.decrease(size)
        self.requested_bytes.decrease(requested)


class CachingAllocator:
    """Caching allocator of one sim device (see the module docstring for the policy)."""

    def __init__(self, device_index: int, limit: int | None = None,
                 device_name: Callable[[int], str] | None = None):
        self.device_index = device_index
        self._limit = limit
        self._fraction = 1.0
        self._device_name = device_name or (lambda i: f"sim:{i}")
        self._lock = threading.RLock()
        self._depth = 0
        self._pending: collections.deque[Block] = collections.deque()
        #: free blocks by (graph pool token or None, size pool), best fit first: (size, segment
        #: number, address, block)
        self._free: dict[tuple, list[tuple[int, int, Block]]] = {(None, pool): [] for pool in _POOLS}
        self._segments: set[_Segment] = set()
        self._serial = 0  # the number the next segment gets
        #: graph pools: token -> how many graphs use it; threads allocating to one: id -> token
        self._pool_users: dict[tuple, int] = {}
        self._routes: dict[int, tuple] = {}
        self._stats = {name: {group: _Stat() for group in STAT_GROUPS} for name in STAT_NAMES}
        #: per size pool, the groups a block of it counts in: all, and the pool
        self._block_stats = {pool: (_BlockStats(self._stats, "all"), _BlockStats(self._stats, pool))
                             for pool in _POOLS}
        self.num_alloc_retries = 0
        self.num_ooms = 0

    # -- configuration ----------------------------------------------------------------------
    @property
    def limit(self) -> int | None:
        """The memory limit in bytes, or None when the nominal capacity applies."""
        return self._limit

    def set_limit(self, limit: int | None) -> None:
        """Set (or with None, lift) the limit; live blocks above a lowered limit stay valid."""
        with self._lock:
            self._limit = limit

    @property
    def capacity(self) -> int:
        """Total bytes of the device: the limit if set, else :data:`NOMINAL_TOTAL_MEMORY`."""
        return NOMINAL_TOTAL_MEMORY if self._limit is None else self._limit

    @property
    def fraction(self) -> float:
        """The share of :attr:`capacity` this process may reserve (1.0 unless set)."""
        return self._fraction

    def set_fraction(self, fraction: float) -> None:
        """Let this process reserve at most ``fraction`` of the capacity (``torch.cuda.
        set_per_process_memory_fraction``): a new segment past it fails with
        ``torch.OutOfMemoryError``; live blocks above a lowered share stay valid."""
        check_fraction(fraction)
        with self._lock:
            self._fraction = fraction

    @property
    def allowed(self) -> int:
        """Bytes this process may reserve: the capacity times :attr:`fraction`."""
        return int(self.capacity * self._fraction)

    # -- allocation -------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Block | None:
        """A block of at least ``nbytes`` bytes (None for 0); raises ``torch.OutOfMemoryError``."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes ({nbytes})")
        if nbytes == 0:
            return None
        size = round_size(nbytes)
        pool = "small_pool" if size <= SMALL_REQUEST else "large_pool"
        private = self._routes.get(threading.get_ident()) if self._routes else None
        with self._lock:
            self._depth += 1
            try:
                block = self._take_cached(size, (private, pool))
                if block is None:
                    block = self._new_segment_block(size, nbytes, pool, private)
                block.free = False
                block.requested = nbytes
                block.segment.blocks += 1
                for stats in self._block_stats[pool]:
                    stats.add(block.size, nbytes)
                return block
            finally:
                self._leave()

    def free(self, block: Block) -> None:
        """Return ``block`` to the cache (it stays reserved until :meth:`empty_cache`)."""
        with self._lock:
            if self._depth:
                self._pending.append(block)
                return
            self._depth += 1
            try:
                self._release(block)
            finally:
                self._leave()

    def empty_cache(self) -> int:
        """Give every wholly free segment back to the host; returns the bytes released."""
        with self._lock:
            self._depth += 1
            try:
                return self._release_free_segments()
            finally:
                self._leave()

    # -- graph pools --------------------------------------------------------------------------
    def retain_pool(self, token: tuple) -> None:
        """A graph begins to use the pool ``token`` (made at its first use)."""
        with self._lock:
            self._pool_users[token] = self._pool_users.get(token, 0) + 1
            for pool in _POOLS:
                self._free.setdefault((token, pool), [])

    def release_pool(self, token: tuple) -> None:
        """A graph stops using the pool ``token``; with no graph left, :meth:`empty_cache`
        gives the pool's free segments back to the host."""
        with self._lock:
            users = self._pool_users.get(token, 0)
            if users <= 0:
                raise RuntimeError(f"graph pool {token} of {self._device_name(self.device_index)} is not in use")
            self._pool_users[token] = users - 1

    @contextlib.contextmanager
    def allocating_to(self, token: tuple) -> Iterator[None]:
        """Within the block, the calling thread's requests take memory of the pool ``token``
        (which a graph must be using)."""
        if not self._pool_users.get(token):
            raise RuntimeError(f"graph pool {token} of {self._device_name(self.device_index)} is not in use")
        me = threading.get_ident()
        before = self._routes.get(me)
        self._routes[me] = token
        try:
            yield
        finally:
            if before is None:
                del self._routes[me]
            else:
                self._routes[me] = before

    def pool_reserved(self, token: tuple) -> int:
        """Bytes of the segments of the pool ``token``."""
        with self._lock:
            return sum(seg.size for seg in self._segments if seg.private == token)

    def _leave(self) -> None:
        try:
            while self._pending and self._depth == 1:
                self._release(self._pending.popleft())
        finally:
            self._depth -= 1

    def _take_cached(self, size: int, free_list: tuple) -> Block | None:
        free = self._free[free_list]
        i = bisect.bisect_left(free, (size, 0, 0))
        if i == len(free):
            return None
        block = free.pop(i)[3]
        self._split(block, size)
        return block

    def _split(self, block: Block, size: int) -> None:
        rest = block.size - size
        if rest < BLOCK_ROUND:
            return
        tail = Block(block.segment, block.ptr + size, rest)
        tail.prev, tail.next = block, block.next
        if block.next is not None:
            block.next.prev = tail
        block.next = tail
        block.size = size
        self._insert_free(tail)

    def _insert_free(self, block: Block) -> None:
        bisect.insort(self._free[block.segment.free_list], (block.size, block.segment.serial, block.ptr, block))

    def _remove_free(self, block: Block) -> None:
        free = self._free[block.segment.free_list]
        i = bisect.bisect_left(free, (block.size, block.segment.serial, block.ptr))
        if i < len(free) and free[i][3] is block:
            del free[i]
        else:  # defensive: never expected, keeps the cache consistent if it happens
            free[:] = [entry for entry in free if entry[3] is not block]

    def _new_segment_block(self, size: int, nbytes: int, pool: str, private: tuple | None) -> Block:
        seg_size = self._segment_size(size, pool)
        if seg_size is None:
            self.num_alloc_retries += 1
            released = self._release_free_segments()
            logger.debug("%s: cache emptied (%d bytes) to fit %d bytes",
                         self._device_name(self.device_index), released, size)
            seg_size = self._segment_size(size, pool)
        if seg_size is None:
            self._raise_oom(nbytes, size)
        try:
            segment = _Segment(seg_size, pool, private, self._serial)
        except RuntimeError:  # the host itself is out of memory
            self._release_free_segments()
            try:
                segment = _Segment(seg_size, pool, private, self._serial)
            except RuntimeError:
                self._raise_oom(nbytes, size, host=True)
        self._serial += 1
        self._segments.add(segment)
        for group in ("all", pool):
            self._stats["segment"][group].increase(1)
            self._stats["reserved_bytes"][group].increase(seg_size)
        block = Block(segment, segment.ptr, seg_size)
        self._split(block, size)
        return block

    def _segment_size(self, size: int, pool: str) -> int | None:
        room = self.allowed - self._stats["reserved_bytes"]["all"].current
        if pool == "large_pool":
            return size if size <= room else None
        seg = min(SMALL_SEGMENT, room - room % BLOCK_ROUND)
        return seg if seg >= size else None

    def _raise_oom(self, nbytes: int, size: int, host: bool = False) -> None:
        self.num_ooms += 1
        device = self._device_name(self.device_index)
        reserved = self._stats["reserved_bytes"]["all"].current
        allocated = self._stats["allocated_bytes"]["all"].current
        if self._limit is not None:
            cap = f"memory limit of {format_size(self._limit)} ({self._limit} bytes)"
        else:
            cap = f"nominal capacity of {format_size(NOMINAL_TOTAL_MEMORY)}"
        if self._fraction < 1.0:
            cap += (f", of which this process may use {self._fraction:g} ({format_size(self.allowed)}, "
                    "set_per_process_memory_fraction)")
        why = "the host could not provide the memory" if host else f"the device has a {cap}"
        advice = ["lower the batch size or free tensors you no longer need"]
        if not host:
            advice.append("raise the limit (memory_virtual_limit / FL_MEMORY_VIRTUAL_LIMIT, or "
                          "flagos_torchfl.sim.set_memory_limit)")
        if reserved - allocated >= size:
            advice.append(f"{format_size(reserved - allocated)} are free only in pieces of partly "
                          "used segments (fragmentation): keep long-lived tensors together, or "
                          "clear the cache regularly (memory_pool_clear_interval)")
        raise torch.OutOfMemoryError(
            f"{device} out of memory: tried to allocate {format_size(nbytes)} ({nbytes} bytes, "
            f"{size} rounded); {why}; {format_size(allocated)} allocated, "
            f"{format_size(reserved)} reserved, "
            f"{format_size(max(self.capacity - reserved, 0))} free. To fit: {'; '.join(advice)}."
        )

    def _release(self, block: Block) -> None:
        if block.free:
            device = self._device_name(self.device_index)
            raise RuntimeError(f"double free of {block!r} on {device}")
        for stats in self._block_stats[block.segment.pool]:
            stats.remove(block.size, block.requested)
        block.segment.blocks -= 1
        block.free = True
        block.requested = 0
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._remove_free(neighbour)
                self._merge(block, neighbour)
        self._insert_free(block)

    @staticmethod
    def _merge(block: Block, other: Block) -> None:
        if other is block.prev:
            block.ptr, block.prev = other.ptr, other.prev
            if other.prev is not None:
                other.prev.next = block
        else:
            block.next = other.next
            if other.next is not None:
                other.next.prev = block
        block.size += other.size

    def _release_free_segments(self) -> int:
        """Give back every wholly free segment of the device's pools and of graph pools no graph
        uses (a pool with neither users nor segments is forgotten)."""
        released = 0
        for (private, pool), free in list(self._free.items()):
            if private is not None and self._pool_users.get(private):
                continue
            keep = []
            for entry in free:
                block = entry[3]
                seg = block.segment
                if block.prev is None and block.next is None and seg.blocks == 0:
                    self._segments.discard(seg)
                    released += seg.size
                    for group in ("all", pool):
                        self._stats["segment"][group].decrease(1)
                        self._stats["reserved_bytes"][group].decrease(seg.size)
                else:
                    keep.append(entry)
            self._free[(private, pool)] = keep
        for token in [t for t, users in self._pool_users.items() if not users]:
            if not any(seg.private == token for seg in self._segments):
                del self._pool_users[token]
                for pool in _POOLS:
                    del self._free[(token, pool)]
        return released

    # -- statistics -------------------------------------------------------------------------
    @property
    def allocated(self) -> int:
        """Bytes in live blocks."""
        return self._stats["allocated_bytes"]["all"].current

    @property
    def reserved(self) -> int:
        """Bytes held from the host (live blocks plus the cache)."""
        return self._stats["reserved_bytes"]["all"].current

    @property
    def max_allocated(self) -> int:
        """Peak of :attr:`allocated` since start or the last peak reset."""
        return self._stats["allocated_bytes"]["all"].peak

    @property
    def max_reserved(self) -> int:
        """Peak of :attr:`reserved` since start or the last peak reset."""
        return self._stats["reserved_bytes"]["all"].peak

    def stats(self) -> collections.OrderedDict[str, int]:
        """All statistics, keyed as ``torch.cuda.memory_stats`` keys them, sorted by key."""
        with self._lock:
            values = [getattr(self._stats[name][group], field)
                      for name in STAT_NAMES for group in STAT_GROUPS for field in STAT_FIELDS]
            return memory_stats(values, self.num_alloc_retries, self.num_ooms)

    def reset_peak(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            for groups in self._stats.values():
                for stat in groups.values():
                    stat.peak = stat.current

    def reset_accumulated(self) -> None:
        """Zero the cumulative counters (allocated/freed totals, retries, OOMs)."""
        with self._lock:
            for groups in self._stats.values():
                for stat in groups.values():
                    stat.allocated = stat.freed = 0
            self.num_alloc_retries = 0
            self.num_ooms = 0
