"""The sim's streams and events when its C++ runtime is registered: PyTorch's own
``torch.Stream`` and ``torch.Event``, whose calls reach the C++ device guard, so that
``torch.sim.Stream(1)`` and ``torch.Stream(device="sim:1")`` are the same kind of object, sharing
ids, the current stream and events, as PyTorch's C++ side sees them.

Work runs inline, so every stream is idle and every wait returns at once; an event records the host
time (``elapsed_time`` in milliseconds, between events created with ``enable_timing=True``).
Creating a stream or recording an event is a use of the devices (lazy initialisation).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import state

_PRIVATEUSE1 = int(torch._C._autograd.DeviceType.PrivateUse1)


class _SimKind(type):
    """``isinstance(x, Stream)`` (``Event``) holds for every ``torch.Stream`` (``torch.Event``) of
    the sim's device type: the classes make PyTorch's own objects, since PyTorch's C++ side
    accepts only its exact types where it takes another stream or event (``elapsed_time``)."""

    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, cls.__base__) and instance.device.type == state.DEVICE_TYPE


def _wrap(index: int, stream_id: int) -> torch.Stream:
    return torch.Stream(stream_id=stream_id, device_index=index, device_type=_PRIVATEUSE1)


class Event(torch.Event, metaclass=_SimKind):
    """An event of the sim devices, made with ``torch.cuda.Event``'s arguments: a ``torch.Event``
    whose ``record()`` without a stream records on the current stream of the current sim device;
    making it is a use of the devices. ``interprocess=True`` is refused: there is no device event to share with another process."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False, **_: Any):
        if interprocess:
            raise RuntimeError("Event: events cannot be shared between processes here "
                               "(work runs inline; there is no device event to share)")
        state.begin_use()
        return torch.Event(device=torch.device(state.DEVICE_TYPE, state.current_device()),
                           enable_timing=enable_timing, blocking=blocking)


class Stream(torch.Stream, metaclass=_SimKind):
    """A new stream of a sim device, made with ``torch.cuda.Stream``'s arguments (``device``,
    ``priority``: a negative one takes a stream of the high-priority pool): a ``torch.Stream``;
    making it is a use of the devices."""

    def __new__(cls, device: Any = None, priority: int = 0, **_: Any):
        index = state.to_index(device)
        state.begin_use()
        return torch.Stream(device=torch.device(state.DEVICE_TYPE, index), priority=priority)


def default_stream(index: int) -> torch.Stream:
    """Device ``index``'s default stream."""
    return _wrap(index, 0)


def current_stream(index: Optional[int] = None) -> torch.Stream:
    """The calling thread's current stream on device ``index`` (None: the current device)."""
    index = state.current_device() if index is None else index
    return _wrap(index, state.cpp_runtime().current_stream(index))


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` the calling thread's current stream on its device."""
    if stream.device.type != state.DEVICE_TYPE:
        raise ValueError(f"expected a {state.DEVICE_TYPE} stream, got a stream of {stream.device}")
    state.cpp_runtime().exchange_stream(stream.device_index, stream.stream_id)
