"""Process-wide state of the sim devices: how many, their allocators and random generators,
the current device of each thread, and whether they were used (lazy initialisation, and the
poisoned child of a ``fork`` after use)."""
from __future__ import annotations

import itertools
import os
import threading
import weakref
from typing import Any, Callable

import torch

from .allocator import CachingAllocator

DEFAULT_SEED = 67280421310721
"""Seed of every device generator until one is set (the value CUDA uses)."""

DEVICE_TYPE = "sim"
"""The device type the sim answers to: ``"sim"`` unless :func:`set_device_type` named it after a
chip (``"npu"`` ...). PyTorch's PrivateUse1 slot has one name per process, so this is set once,
before the sim claims the slot."""

DEVICE_NAME = "flagos sim device"
"""What ``get_device_name`` answers (a profile names the chip's part)."""

BFLOAT16 = True
"""Whether the devices compute bfloat16 (a profile of a chip model without it: False)."""

_allocators: list[Any] = []  # CachingAllocator, or the C++ runtime's CppCachingAllocator
_generators: list["SimGenerator"] = []
_local = threading.local()
_rng_lock = threading.RLock()
_cpp = None
"""The C++ runtime (:class:`.cpp.CppRuntime`) once registered: it holds each thread's
current device, which PyTorch's C++ side then sees too; None: the sim's own thread-local."""


def use_cpp(runtime: object) -> None:
    """Make ``runtime`` (a registered :class:`.cpp.CppRuntime`) hold the current device, and tell
    this module when it uses the devices first."""
    global _cpp
    _cpp = runtime
    runtime.on_first_use(_runtime_began_use)


def cpp_runtime() -> object:
    """The registered C++ runtime, or None when the sim runs with its Python guard."""
    return _cpp


_MASK64 = (1 << 64) - 1
STATE_BYTES = 16
"""Size of a sim generator state: seed (8 bytes) then offset (8 bytes), as CUDA's Philox."""


def _mix(seed: int, offset: int) -> int:
    """The host engine's seed for draws at ``(seed, offset)``: the seed itself at offset 0 (so the
    first random operator after ``manual_seed(s)`` draws what the CPU's kernel draws after
    ``torch.manual_seed(s)``), else splitmix64 of both. Equal pairs give equal streams,
    different offsets unrelated ones."""
    if offset == 0:
        return seed
    x = (seed * 0x9E3779B97F4A7C15 + offset) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class SimGenerator(torch._C.Generator):
    """The random generator of one sim device, modelled on an accelerator's counter-based
    (Philox) generator: its state is a seed and an offset, 16 bytes (``get_state``: seed in
    ``[:8]``, offset in ``[8:]``, little-endian), the offset advances with every random operator
    by the number of values it drew (rounded up to a multiple of 4), and the values an operator
    draws depend only on (seed, offset) — so restoring a state replays exactly, and two states
    with different offsets draw different values (what DTensor's sharded random ops rely on).

    The sim's kernels are the CPU's, which draw from a CPU generator: this object is one (so it can
    be handed to them, and ``isinstance(g, torch.Generator)`` holds), and its CPU engine is
    reseeded from (seed, offset) whenever either changes. The values therefore differ from
    CUDA's Philox stream; only the state's shape and behaviour are the accelerator's."""

    def __new__(cls, index: int = 0):
        generator = super().__new__(cls, "cpu")
        generator._index = index
        generator._seed = DEFAULT_SEED
        generator._offset = 0
        with _rng_lock:
            generator._tag = _TAG_BASE + next(_tags)
            _by_tag[generator._tag] = generator
        generator._sync()
        return generator

    @property
    def device(self) -> torch.device:
        return torch.device(DEVICE_TYPE, self._index)

    def _sync(self) -> None:
        """Reseed the CPU engine from (seed, offset), and write this generator's tag where the
        engine keeps its initial seed (the first 8 bytes of a CPU generator state; draws never read
        it), so :func:`sim_generator` finds this object from any wrapper of the engine."""
        engine = torch._C.Generator
        engine.manual_seed(self, _mix(self._seed, self._offset))
        state = engine.get_state(self)
        state[:8] = torch.tensor([self._tag], dtype=torch.int64).view(torch.uint8)
        engine.set_state(self, state)

    def manual_seed(self, seed: int) -> "SimGenerator":
        """Seed the generator (offset back to 0)."""
        seed = int(seed)
        if not -(1 << 63) <= seed <= _MASK64:
            raise RuntimeError(f"Overflow when unpacking long: seed {seed} is outside the 64-bit range")
        with _rng_lock:
            self._seed, self._offset = seed & _MASK64, 0
            self._sync()
        return self

    def seed(self) -> int:
        """Seed with a non-deterministic 64-bit number and return it."""
        value = int.from_bytes(os.urandom(8), "little") >> 1
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        return self._seed

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> "SimGenerator":
        offset = int(offset)
        if offset < 0 or offset % 4:
            raise RuntimeError(f"sim generator offset must be a non-negative multiple of 4, got {offset}")
        with _rng_lock:
            self._offset = offset
            self._sync()
        return self

    def get_state(self) -> torch.Tensor:
        """``[seed (uint64), offset (int64)]`` as 16 little-endian bytes, a CPU uint8 tensor."""
        raw = self._seed.to_bytes(8, "little") + self._offset.to_bytes(8, "little")
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    def set_state(self, new_state: torch.Tensor) -> "SimGenerator":
        """Restore a state from :meth:`get_state` (a 16-byte uint8 tensor, on any device)."""
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 \
                or new_state.numel() != STATE_BYTES:
            got = (f"{new_state.numel()} {new_state.dtype} values" if isinstance(new_state, torch.Tensor)
                   else type(new_state).__name__)
            raise RuntimeError(
                f"RNG state is wrong size: a {DEVICE_TYPE} generator state is {STATE_BYTES} uint8 "
                f"values (seed: 8 bytes, offset: 8 bytes), got {got}")
        raw = bytes(new_state.detach().to("cpu").contiguous().tolist())
        offset = int.from_bytes(raw[8:], "little", signed=True)
        if offset < 0 or offset % 4:
            raise RuntimeError(f"RNG state offset must be a non-negative multiple of 4, got {offset}")
        with _rng_lock:
            self._seed, self._offset = int.from_bytes(raw[:8], "little"), offset
            self._sync()
        return self

    def advance(self, drawn: int) -> None:
        """Move the offset past ``drawn`` values (an operator drew them; at least 4)."""
        with _rng_lock:
            self._offset += max(4, (int(drawn) + 3) // 4 * 4)
            self._sync()

    def __reduce__(self):
        return (_restore_generator, (self._index, self.get_state()))

    def __repr__(self) -> str:
        return f"<SimGenerator device={self.device}>"


def _restore_generator(index: int, state: torch.Tensor) -> SimGenerator:
    return SimGenerator(index).set_state(state)


_TAG_BASE = 0x51A0_0000_0000_0000
_tags = itertools.count(1)
_by_tag: "weakref.WeakValueDictionary[int, SimGenerator]" = weakref.WeakValueDictionary()


def sim_generator(gen: object) -> SimGenerator | None:
    """The :class:`SimGenerator` that ``gen`` is, or wraps (PyTorch hands a Python kernel a new
    ``torch.Generator`` object for the generator it was given); None for any other generator."""
    if isinstance(gen, SimGenerator):
        return gen
    if isinstance(gen, torch._C.Generator) and gen.device.type == "cpu":
        return _by_tag.get(torch._C.Generator.initial_seed(gen))
    return None


_IDLE, _IN_USE, _BAD_FORK = "idle", "in use", "forked after use"
_use = _IDLE
"""Whether the devices were used in this process, as an accelerator's runtime initialises lazily:
idle until first use, in use from then on; in a child forked from a process that had used them,
poisoned (an accelerator's context does not survive ``fork``). The C++ runtime, whose allocations
use the devices without Python, tells :func:`_runtime_began_use` of its first."""


def begin_use() -> None:
    """Mark the devices used (what an accelerator's lazy initialisation does at first use); in a
    child forked after its parent used them, raise the chip's error instead, naming the fix."""
    global _use
    if _use is not _IN_USE:
        if _use is _BAD_FORK:
            kind = DEVICE_TYPE.upper()
            raise RuntimeError(
                f"Cannot re-initialize {kind} in forked subprocess. To use {kind} with "
                "multiprocessing, you must use the 'spawn' start method")
        _use = _IN_USE
        if _cpp is not None:
            _cpp.mark_used()


def _runtime_began_use() -> None:
    global _use
    if _use is _IDLE:
        _use = _IN_USE


def in_use() -> bool:
    """Whether the devices were used in this process (and it is not a child forked after use)."""
    return _use is _IN_USE


def in_bad_fork() -> bool:
    """Whether this process was forked from one that had used the devices."""
    return _use is _BAD_FORK


def _after_fork_in_child() -> None:
    global _use
    if _use is _IN_USE:  # (the C++ runtime's own handler does the same for its state)
        _use = _BAD_FORK


os.register_at_fork(after_in_child=_after_fork_in_child)


def start(num_devices: int, memory_limit: int | None, allocator_of: Callable[..., Any] = CachingAllocator) -> None:
    """Create ``num_devices`` devices, each with ``memory_limit`` bytes (None: nominal capacity)
    and the allocator ``allocator_of(index, memory_limit, device_name)`` makes (the Python
    runtime's :class:`CachingAllocator` unless the C++ runtime's is given)."""
    _allocators[:] = [allocator_of(i, memory_limit, device_name) for i in range(num_devices)]
    _generators[:] = [SimGenerator(index) for index in range(num_devices)]  # seeded with DEFAULT_SEED


def set_device_type(name: str, device_name: str | None = None, bfloat16: bool = True) -> None:
    """Make ``name`` the sim's device type, ``device_name`` (None: unchanged) its devices' name
    and ``bfloat16`` whether they compute bfloat16 (called once, before the sim claims
    PrivateUse1)."""
    global DEVICE_TYPE, DEVICE_NAME, BFLOAT16
    DEVICE_TYPE = name
    DEVICE_NAME = device_name or DEVICE_NAME
    BFLOAT16 = bfloat16


def device_name(index: int) -> str:
    """``'<device type>:<index>'``, e.g. ``'sim:0'``."""
    return f"{DEVICE_TYPE}:{index}"


def device_count() -> int:
    """Number of sim devices (0 before install)."""
    return len(_allocators)


def check_index(index: int) -> int:
    """``index`` if it names an existing device, else a RuntimeError like CUDA's."""
    n = device_count()
    if not isinstance(index, int) or not 0 <= index < n:
        raise RuntimeError(
            f"invalid sim device index {index!r}: {n} sim device(s) are installed"
            + ("" if n else " (flagos_torchfl.sim.install() was not called)")
        )
    return index


def to_index(device: object = None, optional: bool = True) -> int:
    """The device index meant by ``device`` (int, ``'sim:1'``, ``torch.device``, or None for the
    current device); raises for another device type or an index out of range."""
    if device is None:
        if not optional:
            raise ValueError("a sim device is required")
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != DEVICE_TYPE:
            raise ValueError(f"expected a {DEVICE_TYPE} device, got {device}")
        return current_device() if device.index is None else check_index(device.index)
    if isinstance(device, int) and not isinstance(device, bool):
        return check_index(device)
    raise TypeError(f"cannot interpret {device!r} as a {DEVICE_TYPE} device")


def current_device() -> int:
    """The current device of the calling thread (0 unless set): the C++ runtime's (which
    PyTorch's C++ side reads too) when it is registered, else the sim's own thread-local.
    Asking is not a use of the devices. Under dynamo it is asked through ``torch.accelerator``
    (the sim holds PrivateUse1, so it is PyTorch's accelerator), which dynamo folds at trace
    time and guards on, as it does ``torch.cuda.current_device()``: compiled code that creates
    tensors on the current device has no graph break."""
    if _cpp is not None:
        if torch.compiler.is_compiling():
            return torch.accelerator.current_device_index()
        return _cpp.current_device()
    return getattr(_local, "device", 0)


def set_current_device(index: int) -> None:
    """Make ``index`` the calling thread's current device."""
    check_index(index)
    if _cpp is not None:
        _cpp.set_device(index)
    else:
        _local.device = index


def allocator(index: int) -> Any:
    """The allocator of device ``index``."""
    return _allocators[check_index(index)]


def allocators() -> list[Any]:
    """Every device's allocator, by index."""
    return list(_allocators)


def generator(index: int) -> SimGenerator:
    """The generator that drives random operators on device ``index``."""
    return _generators[check_index(index)]


def draws(result: object) -> int:
    """How many values a random operator that returned ``result`` drew: its tensors' elements."""
    if isinstance(result, torch.Tensor):
        return result.numel()
    if isinstance(result, (list, tuple)):
        return sum(draws(r) for r in result)
    return 0


def run_drawing(gen: SimGenerator, fn):
    """Run ``fn()``, a random operator drawing from ``gen``'s CPU engine, then advance ``gen``
    past what it drew."""
    with _rng_lock:
        result = fn()
        gen.advance(draws(result))
    return result


def run_with_device_rng(index: int, fn):
    """Run ``fn()`` (a random operator without a ``generator`` argument) with the default CPU
    generator temporarily holding device ``index``'s engine, then advance the device generator
    past what it drew and restore the CPU generator."""
    gen = generator(index)
    default = torch.default_generator
    with _rng_lock:
        saved = default.get_state()
        default.set_state(torch._C.Generator.get_state(gen))
        try:
            result = fn()
        finally:
            default.set_state(saved)
        gen.advance(draws(result))
    return result
