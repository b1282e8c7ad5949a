"""The host as a device: the device module the ``cpu`` backend presents where CUDA code expects
one (``torch.cuda.*`` answered on the host), with the honest equivalents of what the host lacks:
device properties without a compute capability, events that record host time, streams that run
work inline, host memory figures, and the one CPU random generator for every logical device.

Its streams and events also stand in on any backend whose device module has none."""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import platform
import sys
import threading
from typing import Any, Optional, Tuple

import torch

from ..inline import InlineEvent, InlineStream

#: per-thread stack of current streams (``torch.cuda.stream(s)`` blocks)
stream_state = threading.local()


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """``torch.cuda.get_device_properties`` where the backend has none: ``major`` / ``minor``
    as the facade's ``get_device_capability()`` answers (the fields' defaults are a device
    without one), no GPU architecture (``gcnArchName`` empty: torch's inductor reads it to key
    its cache)."""

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


def process_memory() -> Tuple[int, int]:
    """(resident, peak resident) bytes of this process: ``VmRSS`` and ``VmHWM`` from
    ``/proc/self/status``; where there is no such file, both are ``getrusage``'s peak."""
    try:
        with open("/proc/self/status") as fh:
            found = {}
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(rest.split()[0]) * 1024
            return found["VmRSS"], found["VmHWM"]
    except (OSError, KeyError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
        return peak, peak


def reset_peak_resident() -> bool:
    """Reset the process's peak resident memory to the current one (Linux ``clear_refs``
    value 5); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Optional[Any]:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def trim_host_heap() -> bool:
    """Return the C heap's free pages to the system (glibc ``malloc_trim(0)``); False where
    the C library has no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def host_memory() -> Optional[int]:
    """Total host memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class HostStream(InlineStream):
    """An inline stream of the host (its device is ``cpu`` whatever index it is given)."""

    def __init__(self, device: Any = None, priority: int = 0, stream_id: Optional[int] = None, **_):
        super().__init__(torch.device("cpu"), priority, stream_id)


class HostRuntime:
    """``torch.cuda``'s device functions answered by the host. Device indices are the cpu
    backend's logical devices (all the same host); the caller checks them."""

    Stream = HostStream
    Event = InlineEvent
    StreamContext = InlineStreamContext

    def __init__(self) -> None:
        self._default_streams: dict = {}

    # devices
    def set_device(self, index: Any) -> None:
        """Nothing to switch: every logical device is the host."""

    def get_device_name(self, index: Any = None) -> str:
        return cpu_name()

    def get_device_properties(self, index: Any = None) -> DeviceProperties:
        """The host's name, memory and core count."""
        return DeviceProperties(name=cpu_name(), total_memory=host_memory() or host_memory_info()[1],
                                multi_processor_count=os.cpu_count() or 1)

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return True

    def synchronize(self, index: Any = None) -> None:
        """Nothing to wait for: host work is complete when it returns. Refused, as CUDA refuses
        it, while a graph capture forbids it (``sim/runtime/graphs.py``)."""
        if "graph_api" in vars(self):  # no capture can be underway before the graph API exists
            from ..sim.runtime import graphs

            graphs.check_not_capturing(self.graph_api.runtime)

    def ipc_collect(self) -> None:
        """The host has no IPC handles to collect."""

    # streams
    def default_stream(self, index: int = 0) -> HostStream:
        if index not in self._default_streams:
            self._default_streams[index] = HostStream(stream_id=0)
        return self._default_streams[index]

    def current_stream(self, index: int = 0) -> Any:
        """The stream of the innermost ``torch.cuda.stream(...)`` block, else the default one."""
        stack = getattr(stream_state, "streams", None)
        return stack[-1] if stack else self.default_stream(index)

    def set_stream(self, stream: Any) -> None:
        if stream is not None:
            stream_state.streams = [stream]

    def stream(self, stream: Any) -> InlineStreamContext:
        return InlineStreamContext(stream)

    # memory: the process's resident memory (the host keeps no device pool)
    def memory_allocated(self, index: Any = None) -> int:
        """The process's resident memory (``VmRSS``): what the host holds for this program,
        tensors and everything else; there is no separate device pool to count."""
        return process_memory()[0]

    memory_reserved = memory_allocated

    def max_memory_allocated(self, index: Any = None) -> int:
        """The process's peak resident memory (``VmHWM``) since start or the last
        :meth:`reset_peak_memory_stats`."""
        return process_memory()[1]

    max_memory_reserved = max_memory_allocated

    def reset_peak_memory_stats(self, index: Any = None) -> None:
        """Make the peak the current resident memory (Linux: ``/proc/self/clear_refs``, which
        also resets ``getrusage``'s ``ru_maxrss``); elsewhere the peak stays the process's."""
        reset_peak_resident()

    def reset_accumulated_memory_stats(self, index: Any = None) -> None:
        """Nothing accumulates: the host keeps no allocation counters."""

    def memory_stats(self, index: Any = None) -> dict:
        """``torch.cuda.memory_stats`` keys for the process's resident memory (current, peak);
        the allocation counters a device pool keeps are absent."""
        current, peak = process_memory()
        return {f"{name}.all.{field}": value for name in ("allocated_bytes", "reserved_bytes")
                for field, value in (("current", current), ("peak", peak))}

    def memory_snapshot(self, *args: Any, **kwargs: Any) -> list:
        """No segments to list: the host keeps no device pool."""
        return []

    def memory_summary(self, index: Any = None, abbreviated: bool = False) -> str:
        current, peak = process_memory()
        return (f"host device {index if index is not None else 0}: no device pool; process resident "
                f"memory {current / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB\n")

    def empty_cache(self) -> None:
        """Give the C allocator's free memory back to the system (glibc ``malloc_trim``); a
        no-op where the C library has no such call."""
        trim_host_heap()

    def mem_get_info(self, index: Any = None) -> tuple:
        """(MemAvailable, MemTotal) of the host."""
        return host_memory_info()

    # graphs: CUDA's capture and replay, the operators recorded and run again on the host
    # (``sim/runtime/graphs.py``); no graph speed-up is promised, the host runs the same kernels
    @functools.cached_property
    def graph_api(self) -> Any:
        """The host's graph API (built at first use: it imports the graph recorder)."""
        from ..sim.runtime import graphs

        return graphs.GraphAPI(graphs.GraphRuntime("CUDA", "cpu", self, lambda tensor: tensor))

    @property
    def CUDAGraph(self) -> type:
        """``torch.cuda.CUDAGraph`` on the host."""
        return self.graph_api.Graph

    @property
    def graph(self) -> type:
        """``torch.cuda.graph`` on the host."""
        return self.graph_api.graph

    def graph_pool_handle(self) -> tuple:
        """A token of a new graph memory pool."""
        return self.graph_api.graph_pool_handle()

    def is_current_stream_capturing(self) -> bool:
        """Whether a graph capture is underway on the current stream."""
        return "graph_api" in vars(self) and self.graph_api.is_current_stream_capturing()

    def make_graphed_callables(self, *args: Any, **kwargs: Any) -> Any:
        """torch's ``make_graphed_callables`` with the host's graphs."""
        return self.graph_api.make_graphed_callables(*args, **kwargs)

    # random numbers: one CPU generator for every logical device
    class _Generators:
        """``default_generators[i]``: the CPU generator, whatever the logical device."""

        def __getitem__(self, index: int) -> torch.Generator:
            return torch.default_generator

    default_generators = _Generators()

    def manual_seed(self, seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    manual_seed_all = manual_seed

    def seed(self) -> None:
        torch.default_generator.seed()

    seed_all = seed

    def initial_seed(self) -> int:
        return torch.default_generator.initial_seed()

    def get_rng_state(self, index: Any = None) -> torch.Tensor:
        return torch.default_generator.get_state()

    def set_rng_state(self, new_state: torch.Tensor, index: Any = None) -> None:
        torch.default_generator.set_state(new_state.cpu())
