"""Streams and events of a device whose work runs inline, in order, in the calling thread (the
host under the cpu backend, the sim): work has finished when a call returns, so a stream is
always idle, every wait returns at once, and an event is the host time at which it was recorded
(``elapsed_time`` in milliseconds). A misuse raises what CUDA raises for it."""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Optional


class InlineEvent:
    """``torch.cuda.Event`` where work runs inline. ``interprocess=True`` is refused: there is
    no device event to share with another process."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, **_: Any):
        if interprocess:
            raise RuntimeError(f"{type(self).__name__}: events cannot be shared between processes "
                               "here (work runs inline; there is no device event to share)")
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.device: Any = None
        self._time: Optional[float] = None

    def record(self, stream: Any = None) -> None:
        """Mark the event at the current host time (on ``stream``: its device is the event's)."""
        if stream is not None:
            self.device = getattr(stream, "device", None)
        self._time = time.perf_counter()

    def elapsed_time(self, end_event: "InlineEvent") -> float:
        """Milliseconds of host time between this event's and ``end_event``'s recording."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    def query(self) -> bool:
        """True: the work before the event has completed."""
        return True

    def synchronize(self) -> None:
        """Return at once: the work before the event has completed."""

    def wait(self, stream: Any = None) -> None:
        """Return at once: the work before the event has completed."""

    def __repr__(self) -> str:
        state = "recorded" if self._time is not None else "not recorded"
        return f"<{type(self).__name__} {state}>"


class InlineStream:
    """``torch.cuda.Stream`` where work runs inline: every query is True and every wait returns
    at once. Streams are equal when their device and ``stream_id`` are."""

    #: the event class :meth:`record_event` makes
    event_class = InlineEvent
    _ids = itertools.count(1)
    _ids_lock = threading.Lock()

    def __init__(self, device: Any = None, priority: int = 0, stream_id: Optional[int] = None,
                 **_: Any):
        """``stream_id``: 0 for a device's default stream; None: a new id of its own."""
        if stream_id is None:
            with InlineStream._ids_lock:
                stream_id = next(InlineStream._ids)
        self.device = device
        self.priority = priority
        self.stream_id = stream_id

    @property
    def cuda_stream(self) -> int:
        """The stream's raw handle, which CUDA code passes to its own kernels and libraries: its
        id (0 for a device's default stream)."""
        return self.stream_id

    def query(self) -> bool:
        """True: all work submitted to the stream has completed."""
        return True

    def synchronize(self) -> None:
        """Return at once: the stream's work has completed."""

    def wait_event(self, event: Any) -> None:
        """Return at once: the event's work has completed."""

    def wait_stream(self, stream: Any) -> None:
        """Return at once: the other stream's work has completed."""

    def record_event(self, event: Optional[InlineEvent] = None) -> InlineEvent:
        """Record ``event`` (a new one if None) on this stream and return it."""
        event = self.event_class() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, InlineStream) and other.device == self.device
                and other.stream_id == self.stream_id)

    def __hash__(self) -> int:
        return hash((self.device, self.stream_id))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} device={self.device} stream_id={self.stream_id}>"
