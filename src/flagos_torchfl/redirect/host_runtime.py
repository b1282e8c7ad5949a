"""Honest stand-ins for CUDA runtime objects on a backend that has no such notion (the CPU):
device properties without a compute capability, events that record host time, streams that
run work inline, and host memory figures."""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, Optional

#: per-thread stack of current streams (``torch.cuda.stream(s)`` blocks)
stream_state = threading.local()


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """``torch.cuda.get_device_properties`` where the backend has none: no compute
    capability (major=minor=0, so capability-gated CUDA kernels stay off), no GPU architecture
    (``gcnArchName`` empty: torch's inductor reads it to key its cache)."""

    name: str
    total_memory: int
    multi_processor_count: int
    major: int = 0
    minor: int = 0
    is_integrated: bool = True
    is_multi_gpu_board: bool = False
    gcnArchName: str = ""
    uuid: str = ""
    L2_cache_size: int = 0
    warp_size: int = 1


class HostEvent:
    """``torch.cuda.Event`` on a device without events: work has already run when ``record``
    is called, so an event is a host timestamp; ``elapsed_time`` is in milliseconds."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **_):
        self.enable_timing = enable_timing
        self._time: Optional[float] = None

    def record(self, stream: Any = None) -> None:
        self._time = time.perf_counter()

    def elapsed_time(self, end_event: "HostEvent") -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return (end_event._time - self._time) * 1000.0

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for: host work is complete when it returns."""

    def wait(self, stream: Any = None) -> None:
        """Nothing to wait for."""


class InlineStream:
    """``torch.cuda.Stream`` on a device without streams: work runs inline, in order, so
    every query is True and every wait returns at once."""

    def __init__(self, device: Any = None, priority: int = 0, **_):
        self.device = device
        self.priority = priority

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def wait_event(self, event: Any) -> None:
        """Nothing to wait for."""

    def wait_stream(self, stream: Any) -> None:
        """Nothing to wait for."""

    def record_event(self, event: Optional[HostEvent] = None) -> HostEvent:
        event = event if event is not None else HostEvent()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<InlineStream device={self.device}>"


def host_memory_info() -> tuple:
    """(available, total) host memory in bytes from /proc/meminfo (sysconf elsewhere)."""
    try:
        values = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
        return values["MemAvailable"], values["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        return free, total


class InlineStreamContext:
    """``torch.cuda.stream(s)`` / ``torch.cuda.StreamContext(s)`` on a device without streams:
    makes ``s`` this thread's current stream inside the block (None: no change)."""

    def __init__(self, stream: Any):
        self.stream = stream

    def __enter__(self) -> Any:
        if self.stream is not None:
            stack = getattr(stream_state, "streams", None)
            if stack is None:
                stack = stream_state.streams = []
            stack.append(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> bool:
        if self.stream is not None:
            stream_state.streams.pop()
        return False
