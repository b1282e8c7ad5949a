"""Process-wide state of the sim devices: how many, their allocators and random generators,
and the current device of each thread."""
from __future__ import annotations

import threading

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

_allocators: list[CachingAllocator] = []
_generators: list["SimGenerator"] = []
_local = threading.local()
_rng_lock = threading.RLock()


class SimGenerator(torch._C.Generator):
    """The random generator of one sim device: a CPU generator (the sim's kernels are the CPU's
    and draw from it) that reports its sim device. ``isinstance(g, torch.Generator)`` holds."""

    def __new__(cls, index: int = 0):
        generator = super().__new__(cls, "cpu")
        generator._index = index
        return generator

    @property
    def device(self) -> torch.device:
        return torch.device(DEVICE_TYPE, self._index)

    def __repr__(self) -> str:
        return f"<SimGenerator device={self.device}>"


def start(num_devices: int, memory_limit: int | None) -> None:
    """Create ``num_devices`` devices, each with ``memory_limit`` bytes (None: nominal capacity)."""
    _allocators[:] = [CachingAllocator(i, memory_limit, device_name) for i in range(num_devices)]
    gens = []
    for index in range(num_devices):
        g = SimGenerator(index)
        g.manual_seed(DEFAULT_SEED)
        gens.append(g)
    _generators[:] = gens


def set_device_type(name: str, device_name: str | None = None) -> None:
    """Make ``name`` the sim's device type and ``device_name`` (None: unchanged) its devices'
    name (called once, before the sim claims PrivateUse1)."""
    global DEVICE_TYPE, DEVICE_NAME
    DEVICE_TYPE = name
    DEVICE_NAME = device_name or DEVICE_NAME


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
    """The current device of the calling thread (0 unless set)."""
    return getattr(_local, "device", 0)


def set_current_device(index: int) -> None:
    """Make ``index`` the calling thread's current device."""
    _local.device = check_index(index)


def allocator(index: int) -> CachingAllocator:
    """The allocator of device ``index``."""
    return _allocators[check_index(index)]


def allocators() -> list[CachingAllocator]:
    """Every device's allocator, by index."""
    return list(_allocators)


def generator(index: int) -> torch.Generator:
    """The CPU generator that drives random operators on device ``index``."""
    return _generators[check_index(index)]


def run_with_device_rng(index: int, fn):
    """Run ``fn()`` with the default CPU generator temporarily holding the state of device
    ``index``'s generator (for random operators without a ``generator`` argument); the advanced
    state goes back to the device generator and the CPU generator is restored."""
    gen = generator(index)
    default = torch.default_generator
    with _rng_lock:
        saved = default.get_state()
        default.set_state(gen.get_state())
        try:
            return fn()
        finally:
            gen.set_state(default.get_state())
            default.set_state(saved)
