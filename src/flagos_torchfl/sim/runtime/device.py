"""The ``torch.sim`` device module: what PyTorch and scripts look up on ``torch.<device>``.

Arguments named ``device`` accept an index, ``'sim:N'``, a ``torch.device`` or None (the current
device), as on ``torch.cuda``. Work on a sim device runs inline in the calling thread, so it has
finished when a call returns: streams are always idle, synchronisation returns at once, and an
event's time is the host time at which it was recorded.

The devices initialise lazily, as CUDA's do: :func:`is_initialized` is False until their first
use (a tensor on a device, a kernel, :func:`set_device`, :func:`synchronize`, a stream or event of
the program's own, the RNG state, :func:`init`); queries (count, name, properties, memory
figures) and seeding do not count. A child forked after its parent used them fails when it
touches them, with the chip's own message; a child forked before, or one that never touches
them, works.
"""
from __future__ import annotations

import collections
import functools
import sys
import threading
from typing import Any, Callable, Iterable

import torch

from ...aten import dispatcher
from ...inline import InlineEvent, InlineStream
from . import state, tensors

__all__ = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "device",
    "device_of", "synchronize", "get_device_name", "get_device_properties",
    "get_amp_supported_dtype", "is_bf16_supported",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
    "set_rng_state", "get_rng_state_all", "set_rng_state_all",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "memory_stats", "mem_get_info",
    "empty_cache", "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    "caching_allocator_alloc", "caching_allocator_delete",
    "Stream", "Event", "current_stream", "default_stream", "set_stream", "stream",
    "StreamContext", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables",
]

#: the dispatch key whose kernels make ``torch.autocast("<sim device>")`` cast
AUTOCAST_KEY = "AutocastPrivateUse1"

_index = state.to_index


# -- availability and devices ----------------------------------------------------------------
def is_available() -> bool:
    """True once the sim is installed with at least one device."""
    return state.device_count() > 0


def is_initialized() -> bool:
    """Whether the devices were used in this process (see the module's docstring); False in a
    child forked after its parent used them."""
    return state.in_use()


def init() -> None:
    """Initialise the devices now (what their first use does); in a child forked after its
    parent used them, raise the chip's error naming the 'spawn' start method."""
    if not is_available():
        raise RuntimeError(f"no {state.DEVICE_TYPE} device is installed")
    state.begin_use()


_lazy_init = init
"""What PyTorch calls before it first uses a device module's devices."""


def _is_in_bad_fork() -> bool:
    """Whether this process was forked from one that had used the devices."""
    return state.in_bad_fork()


def device_count() -> int:
    """Number of sim devices."""
    return state.device_count()


def current_device() -> int:
    """Index of the calling thread's current sim device."""
    return state.current_device()


def set_device(device: Any) -> None:
    """Make ``device`` the calling thread's current sim device (a negative index is ignored)."""
    if isinstance(device, int) and device < 0:
        return
    index = _index(device)
    state.begin_use()
    state.set_current_device(index)


class device:
    """Context manager that makes ``device`` the current sim device and restores the previous
    one on exit (``None`` or a negative index changes nothing)."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else (device if isinstance(device, int) and device < 0
                                              else _index(device))
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            state.begin_use()
            self.prev_idx = state.current_device()
            state.set_current_device(self.idx)
        return self

    def __exit__(self, *exc: object) -> bool:
        if self.idx >= 0:
            state.set_current_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current (if it is a sim tensor)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == state.DEVICE_TYPE else -1)


def synchronize(device: Any = None) -> None:
    """Wait for all work on ``device``: returns at once, since sim work runs inline. Refused
    while a graph capture forbids it (:func:`.graphs.check_not_capturing`)."""
    _index(device)
    if _graph_api.cache_info().currsize:  # without the graph API built no capture is underway
        from . import graphs

        graphs.check_not_capturing(_graph_api().runtime)
    state.begin_use()


def get_device_name(device: Any = None) -> str:
    """The devices' name: ``'flagos sim device'`` unless installed with another."""
    _index(device)
    return state.DEVICE_NAME


class _DeviceProperties:
    """What :func:`get_device_properties` reports about one sim device."""

    def __init__(self, index: int):
        self.name = state.DEVICE_NAME
        self.type = state.DEVICE_TYPE
        self.index = index
        self.total_memory = state.allocator(index).capacity
        self.is_integrated = True
        self.multi_processor_count = 1
        self.major = 0
        self.minor = 0

    def __repr__(self) -> str:
        return (f"_SimDeviceProperties(name='{self.name}', index={self.index}, "
                f"total_memory={self.total_memory // (1 << 20)}MB)")


def get_device_properties(device: Any = None) -> _DeviceProperties:
    """Name, index and total memory (the memory limit if set, else the nominal 16 GiB)."""
    return _DeviceProperties(_index(device))


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The low-precision dtypes autocast casts to on the sim: float16, and bfloat16 where the
    devices compute it (a chip model without it: float16 only), once its autocast key has
    casting rules (activating the sim backend registers CUDA's), else none
    (``torch.autocast("sim", ...)`` then warns and stays off instead of casting nothing)."""
    if not dispatcher.autocast_casts(AUTOCAST_KEY):
        return []
    return [torch.float16, torch.bfloat16] if state.BFLOAT16 else [torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether autocast in bfloat16 works on the sim: its devices compute bfloat16 (its kernels
    are the CPU's; a chip model without bfloat16 says False) and autocast casts to it once the
    casting rules are registered."""
    return torch.bfloat16 in get_amp_supported_dtype()


# -- random numbers ------------------------------------------------------------------------
_absent_attribute_listeners: list[Callable[[str], None]] = []


def listen_for_absent_attributes(listener: Callable[[str], None]) -> None:
    """Call ``listener(name)`` whenever torch asks this module for an attribute it lacks, before
    the AttributeError (the sim's Inductor backend registers itself when Inductor asks for
    ``Scheduling``: :func:`.inductor.asked_for`)."""
    _absent_attribute_listeners.append(listener)


def __getattr__(name: str) -> Any:
    """``default_generators``: every device's generator (:class:`state.SimGenerator`), by index;
    ``_initialized``: :func:`is_initialized`; ``<TYPE>Graph`` (``SIMGraph``, ``NPUGraph``...) and
    ``graph``: the device's graph class and capturing context (:mod:`.graphs`). Any other name
    is told to the listeners of :func:`listen_for_absent_attributes` and stays absent."""
    if name == "graph" or name == f"{state.DEVICE_TYPE.upper()}Graph":
        api = _graph_api()
        return api.graph if name == "graph" else api.Graph
    if name == "default_generators":
        return tuple(state.generator(i) for i in range(state.device_count()))
    if name == "_initialized":  # torch.utils.checkpoint saves device RNG states only if True
        return is_initialized()
    for listener in _absent_attribute_listeners:
        listener(name)
    raise AttributeError(f"module 'torch.{state.DEVICE_TYPE}' has no attribute {name!r}")


def manual_seed(seed: int) -> None:
    """Seed the current device's generator."""
    state.generator(state.current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator."""
    for i in range(state.device_count()):
        state.generator(i).manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a non-deterministic number."""
    state.generator(state.current_device()).seed()


def seed_all() -> None:
    """Seed every device's generator with one non-deterministic number."""
    value = torch.Generator().seed()
    manual_seed_all(value)


def initial_seed() -> int:
    """The seed the current device's generator was last seeded with."""
    return state.generator(state.current_device()).initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    """The state of ``device``'s generator (None: the current device): 16 bytes, seed then
    offset, as a CPU ByteTensor (see :class:`state.SimGenerator`)."""
    index = _index(device)
    state.begin_use()
    return state.generator(index).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    """Restore ``device``'s generator (None: the current device) from a state returned by
    :func:`get_rng_state`."""
    index = _index(device)
    state.begin_use()
    state.generator(index).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    """Every device's generator state, by index."""
    return [state.generator(i).get_state() for i in range(state.device_count())]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restore every device's generator, by index."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# -- memory ----------------------------------------------------------------------------------
def memory_allocated(device: Any = None) -> int:
    """Bytes held by live sim tensors' storages on ``device`` (rounded to 512-byte blocks)."""
    return state.allocator(_index(device)).allocated


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last :func:`reset_peak_memory_stats`."""
    return state.allocator(_index(device)).max_allocated


def memory_reserved(device: Any = None) -> int:
    """Bytes reserved by ``device``'s caching allocator (allocated plus cached)."""
    return state.allocator(_index(device)).reserved


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved` since start or the last :func:`reset_peak_memory_stats`."""
    return state.allocator(_index(device)).max_reserved


def reset_peak_memory_stats(device: Any = None) -> None:
    """Set ``device``'s peak statistics to their current values."""
    state.allocator(_index(device)).reset_peak()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zero ``device``'s cumulative counters (allocations, frees, retries, OOMs)."""
    state.allocator(_index(device)).reset_accumulated()


def memory_stats(device: Any = None) -> collections.OrderedDict[str, int]:
    """``device``'s allocator statistics, keyed like ``torch.cuda.memory_stats``."""
    return state.allocator(_index(device)).stats()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device``: total is the memory limit if set, else the nominal
    16 GiB; free is total minus the reserved bytes."""
    alloc = state.allocator(_index(device))
    return max(alloc.capacity - alloc.reserved, 0), alloc.capacity


def empty_cache() -> None:
    """Release every device's cached, unused memory back to the host."""
    for alloc in state.allocators():
        alloc.empty_cache()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Let this process reserve at most ``fraction`` (a float in [0, 1]) of ``device``'s total
    memory; an allocation past it raises ``torch.OutOfMemoryError``, as on CUDA."""
    state.allocator(_index(device)).set_fraction(fraction)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The share of ``device``'s total memory this process may reserve (1.0 unless set)."""
    return state.allocator(_index(device)).fraction


_raw_blocks: dict[int, tuple[Any, Any]] = {}
_raw_lock = threading.Lock()


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """``size`` bytes from ``device``'s caching allocator, outside any tensor: returns the
    block's address, valid until :func:`caching_allocator_delete` (``stream``: any stream of the
    device; work runs inline)."""
    if stream is not None and not isinstance(stream, int) and not hasattr(stream, "stream_id"):
        raise TypeError("Invalid type for stream argument, must be a stream of the device or `int` "
                        "representing a pointer to an existing stream")
    alloc = state.allocator(_index(device))
    state.begin_use()
    block = alloc.allocate(int(size))
    if block is None:
        return 0
    with _raw_lock:
        _raw_blocks[block.ptr] = (alloc, block)
    return block.ptr


def caching_allocator_delete(mem_ptr: int) -> None:
    """Give back the block :func:`caching_allocator_alloc` returned at ``mem_ptr`` (0: nothing)."""
    if mem_ptr == 0:
        return
    with _raw_lock:
        found = _raw_blocks.pop(mem_ptr, None)
    if found is None:
        raise RuntimeError(f"invalid device pointer: 0x{mem_ptr:x}")
    alloc, block = found
    alloc.free(block)


# -- streams and events ----------------------------------------------------------------------
class Event(InlineEvent):
    """A sim event: recording takes the host time (a use of the device), and the event is
    complete at once."""

    def record(self, stream: Stream | None = None) -> None:
        """Mark the event at the current host time on ``stream`` (default: the current one)."""
        stream = current_stream() if stream is None else stream
        state.begin_use()
        super().record(stream)


class Stream(InlineStream):
    """A sim stream. Work runs inline, so a stream is always idle; the class exists so that
    stream-aware code runs unchanged. A stream of the program's own is a use of the device."""

    event_class = Event

    def __init__(self, device: Any = None, priority: int = 0, *, _stream_id: int | None = None):
        index = _index(device)
        if _stream_id is None:
            state.begin_use()
        super().__init__(torch.device(state.DEVICE_TYPE, index), priority, _stream_id)


_default_streams: dict[int, Stream] = {}
_stream_local = threading.local()


def use_cpp_streams() -> None:
    """Make :class:`Stream` and :class:`Event` PyTorch's ``torch.Stream`` / ``torch.Event`` on the
    C++ runtime's guard (:mod:`.streams`, imported only then: a torch older than the
    sim's floor has no ``torch.Event``), once it is registered."""
    global Stream, Event
    from . import streams as cpp_streams

    Stream, Event = cpp_streams.Stream, cpp_streams.Event


def default_stream(device: Any = None) -> Stream:
    """``device``'s default stream."""
    index = _index(device)
    if state.cpp_runtime() is not None:
        from .streams import default_stream as cpp_default

        return cpp_default(index)
    s = _default_streams.get(index)
    if s is None:
        s = _default_streams.setdefault(index, Stream(index, _stream_id=0))
    return s


def current_stream(device: Any = None) -> Stream:
    """The calling thread's current stream on ``device`` (its default stream unless set)."""
    index = _index(device)
    if state.cpp_runtime() is not None:
        from .streams import current_stream as cpp_current

        return cpp_current(index)
    current = getattr(_stream_local, "streams", {})
    return current.get(index) or default_stream(index)


def set_stream(stream: Stream) -> None:
    """Make ``stream`` current on its device for the calling thread."""
    if stream is None:
        return
    if state.cpp_runtime() is not None:
        from .streams import set_stream as cpp_set

        return cpp_set(stream)
    if not hasattr(_stream_local, "streams"):
        _stream_local.streams = {}
    _stream_local.streams[stream.device.index] = stream


class StreamContext:
    """Context manager that makes ``stream`` current (and its device the current device)."""

    def __init__(self, stream: Stream | None):
        self.stream = stream
        self._prev_stream: Stream | None = None
        self._device: device | None = None

    def __enter__(self):
        if self.stream is not None:
            self._device = device(self.stream.device.index)
            self._device.__enter__()
            self._prev_stream = current_stream(self.stream.device.index)
            set_stream(self.stream)
        return self

    def __exit__(self, *exc: object) -> bool:
        if self.stream is not None:
            set_stream(self._prev_stream)
            self._device.__exit__(*exc)
        return False


def stream(stream: Stream | None) -> StreamContext:
    """Context manager selecting ``stream`` (None selects nothing)."""
    return StreamContext(stream)


# -- graphs ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _graph_api() -> graphs.GraphAPI:
    """The graph API of the device type the sim was installed as (its name in the graph class
    and the runtime's messages: ``NPUGraph``, "NPU error: ..."), built (and :mod:`.graphs`
    imported) when a program first asks for graphs."""
    from . import graphs

    name = state.DEVICE_TYPE.upper()
    return graphs.GraphAPI(graphs.GraphRuntime(name, state.DEVICE_TYPE, sys.modules[__name__],
                                               tensors.host_view))


def graph_pool_handle() -> tuple:
    """A token of a new graph memory pool, which the graphs given it share."""
    return _graph_api().graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """Whether a graph capture is underway on the current stream."""
    return _graph_api().is_current_stream_capturing()


def make_graphed_callables(*args: Any, **kwargs: Any) -> Any:
    """torch's ``make_graphed_callables`` with the device's graphs (:class:`.graphs.GraphAPI`)."""
    return _graph_api().make_graphed_callables(*args, **kwargs)
