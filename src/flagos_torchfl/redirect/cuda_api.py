"""The ``torch.cuda`` facade: ``torch.cuda.*`` answered by the active backend.

While active, the ``torch.cuda`` module object gets a ModuleType subclass whose attribute
lookup answers from :class:`CudaFacade` (no attribute of the module is rewritten, so undoing is
giving the module its class back). Rules for ``torch.cuda.<name>``:

* a served name (the table in :meth:`CudaFacade.served`) answers for the backend;
* a private name (``_lazy_init``, ``_is_compiled``...) reaches the real module unchanged, since
  torch's own code uses them — except ``_record_memory_history``-style profiling hooks, which
  are unserved stand-ins (below);
* any other public name is delegated to the backend's device module when it has one of that
  name (``torch.npu.utilization``...; its device arguments pass unchanged), and otherwise is an
  *unserved stand-in*: a class that raises
  :class:`~flagos_torchfl.errors.UnsupportedFeatureError`, naming the attribute and the backend,
  as soon as it is called, instantiated or has an attribute read. Reading the name itself does
  not raise, because libraries name CUDA-only types at import time (annotations such as
  ``torch.cuda.CUDAGraph | None`` in transformers, ``isinstance(v, torch.cuda.StreamContext)``
  in dynamo); ``isinstance(x, stand_in)`` is simply False.

Where the backend has no such notion the answer is the honest equivalent, documented per
function: the CPU has no streams (a stream runs work inline; an event records host time), no
allocator statistics (counters answer 0, ``mem_get_info`` reads host memory) and one random
generator (``torch.cuda.manual_seed`` seeds the CPU generator). The CUDA RNG stream itself is
not reproduced on another chip: a seeded script is deterministic on each backend, with numbers
of that backend's generator.

``torch.accelerator`` and ``torch.get_device_module()`` are not touched: they report the real
backend (on the CPU backend, no accelerator).
"""
from __future__ import annotations

import contextlib
import os
import types
from typing import Any, Callable, Dict, Optional

import torch

from ..errors import UnsupportedFeatureError
from .devices import Target
from .host_runtime import (
    DeviceProperties, HostEvent, InlineStream, InlineStreamContext, host_memory_info, stream_state,
)
from .patches import Patcher, patch_function

#: private names that are features, not plumbing: unserved stand-ins like unserved public names
DENIED_PRIVATE = frozenset({"_record_memory_history", "_dump_snapshot", "_snapshot", "_sleep"})
#: hints added to the error of some unserved names
HINTS = {
    "graph": "CUDA graphs are a CUDA-only feature",
    "CUDAGraph": "CUDA graphs are a CUDA-only feature",
    "make_graphed_callables": "CUDA graphs are a CUDA-only feature",
}
#: the legacy ``torch.cuda.<X>Tensor`` types and their dtypes
LEGACY_TYPES = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
    "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8,
    "BoolTensor": torch.bool,
}

_active: Dict[str, Any] = {"facade": None, "backends_cuda": None}


def unsupported(name: str, target: Target, where: str = "torch.cuda") -> UnsupportedFeatureError:
    """The error for ``where.name`` on a backend that cannot serve it."""
    hint = HINTS.get(name)
    return UnsupportedFeatureError(
        f"{where}.{name} is not available on backend {target.backend!r} "
        f"(device type {target.device_type!r}){': ' + hint if hint else ''}"
    )


class _UnservedMeta(type):
    """Stand-ins raise on use: calling, instantiating, reading an attribute."""

    def __call__(cls, *args, **kwargs):
        raise cls._error()

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise cls._error()


def unserved(name: str, target: Target, where: str = "torch.cuda") -> type:
    """The stand-in for ``where.name``: a class that raises UnsupportedFeatureError on use."""
    error = unsupported(name, target, where)

    def _error() -> UnsupportedFeatureError:
        return UnsupportedFeatureError(str(error))

    return _UnservedMeta(name, (), {"_error": staticmethod(_error), "__module__": where, "__doc__": str(error)})


def alias_class(real: type, make: Callable[..., Any], module: str = "torch.cuda") -> type:
    """A class standing for ``real``: constructing it calls ``make`` (which returns a ``real``
    instance) and ``isinstance``/``issubclass`` answer as for ``real``."""

    class _Meta(type):
        def __instancecheck__(cls, instance):
            return isinstance(instance, real)

        def __subclasscheck__(cls, subclass):
            return issubclass(subclass, real)

    def __new__(cls, *args, **kwargs):
        return make(*args, **kwargs)

    return _Meta(real.__name__, (), {"__new__": __new__, "__module__": module, "__doc__": real.__doc__})


class _FacadeModule(types.ModuleType):
    """The class ``torch.cuda`` wears while the facade is active."""

    def __getattribute__(self, name):
        facade = _active["facade"]
        if facade is not None:
            value = facade.lookup(name)
            if value is not _PASS:
                return value
        return types.ModuleType.__getattribute__(self, name)


class _BackendsCudaModule(types.ModuleType):
    """The class ``torch.backends.cuda`` wears: flags pass, CUDA-only objects are stand-ins."""

    DENIED = frozenset({"cufft_plan_cache", "preferred_blas_library", "preferred_rocm_fa_library"})

    def __getattribute__(self, name):
        stand_ins = _active["backends_cuda"]
        if stand_ins is not None and name in stand_ins:
            return stand_ins[name]
        return types.ModuleType.__getattribute__(self, name)


_PASS = object()


class Namespace(types.ModuleType):
    """A stand-in for a ``torch.cuda`` submodule: served names, private names of the real
    submodule, and unserved stand-ins for the rest."""

    def __init__(self, name: str, served: Dict[str, Any], real: Any, target: Target):
        super().__init__(name)
        self.__dict__.update(served)
        self._real, self._target = real, target

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name.startswith("_") and name not in DENIED_PRIVATE and self._real is not None:
            return getattr(self._real, name)
        stand_in = unserved(name, self._target, self.__name__)
        setattr(self, name, stand_in)
        return stand_in


def _legacy_type(name: str, dtype: torch.dtype, target: Target) -> type:
    """``torch.cuda.<name>``: constructs like ``torch.<name>`` and moves to the target;
    ``isinstance`` is True for tensors of that dtype on the backend's device."""
    cpu_type = getattr(torch, name)

    class _Meta(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, torch.Tensor) and obj.dtype == dtype and obj.device.type == target.device_type

    def __new__(cls, *args, **kwargs):
        return cpu_type(*args, **kwargs).to(target.translate("cuda"))

    return _Meta(name, (), {"__new__": __new__, "dtype": dtype, "__module__": "torch.cuda"})


class CudaFacade:
    """The answers of ``torch.cuda.*`` for one :class:`Target`.

    Device arguments are logical (``cuda:i`` / ``i``) and reach the backend's module as the
    physical index ``target.devices[i]``. On a CUDA backend (only reached when ``gpu_ids``
    renumbers devices) just the index-taking functions are served; everything else is the real
    ``torch.cuda``.
    """

    def __init__(self, target: Target, cuda_module: types.ModuleType):
        self.t = target
        self._cuda = cuda_module
        self._host = target.is_cpu
        self._default_streams: Dict[int, Any] = {}
        self._table = self.served()

    # -------------------------------------------------------------- plumbing
    def _mod(self, name: str) -> Any:
        """The backend module's attribute ``name`` (None when it has none). On a CUDA backend
        this reads the real ``torch.cuda`` past the facade."""
        module = self.t.module
        try:
            if isinstance(module, types.ModuleType):
                return types.ModuleType.__getattribute__(module, name)
            return getattr(module, name)
        except AttributeError:
            return None

    def _served_by_module(self, name: str) -> Optional[Callable]:
        """The backend module's function ``name`` unless the backend is the host CPU (whose
        ``torch.cpu`` functions of these names are device-agnostic stubs)."""
        return None if self._host else self._mod(name)

    def _phys(self, device: Any = None) -> int:
        return self.t.physical(self.t.logical_index(device))

    def lookup(self, name: str) -> Any:
        """The value of ``torch.cuda.<name>`` (or ``_PASS`` for the real module's)."""
        found = self._table.get(name, _PASS)
        if found is not _PASS:
            return found
        if self.t.native or (name.startswith("_") and name not in DENIED_PRIVATE):
            return _PASS
        if not name.startswith("_"):
            delegate = self._served_by_module(name)
            if delegate is not None:
                return delegate
        stand_in = self._table[name] = unserved(name, self.t)
        return stand_in

    # -------------------------------------------------------------- the table
    def served(self) -> Dict[str, Any]:
        """Every served ``torch.cuda`` name and its answer."""
        f = self
        table: Dict[str, Any] = {
            "device_count": f.device_count, "current_device": f.current_device,
            "set_device": f.set_device, "device": f.device_context_class(),
            "device_of": f.device_of, "get_device_name": f.get_device_name,
            "get_device_properties": f.get_device_properties,
            "get_device_capability": f.get_device_capability, "synchronize": f.synchronize,
            "Stream": f.stream_class(), "Event": f.event_class(),
            "current_stream": f.current_stream, "default_stream": f.default_stream,
            "stream": f.stream, "set_stream": f.set_stream,
            "memory_allocated": f.memory_allocated, "memory_reserved": f.memory_reserved,
            "max_memory_allocated": f.max_memory_allocated,
            "max_memory_reserved": f.max_memory_reserved,
            "memory_cached": f.memory_reserved, "max_memory_cached": f.max_memory_reserved,
            "reset_peak_memory_stats": f.reset_peak_memory_stats,
            "reset_max_memory_allocated": f.reset_peak_memory_stats,
            "reset_max_memory_cached": f.reset_peak_memory_stats,
            "reset_accumulated_memory_stats": f.reset_accumulated_memory_stats,
            "empty_cache": f.empty_cache, "mem_get_info": f.mem_get_info,
            "memory_stats": f.memory_stats, "memory_stats_as_nested_dict": f.memory_stats,
            "memory_summary": f.memory_summary, "memory_snapshot": f.memory_snapshot,
            "manual_seed": f.manual_seed, "manual_seed_all": f.manual_seed_all,
            "seed": f.seed, "seed_all": f.seed_all, "initial_seed": f.initial_seed,
            "get_rng_state": f.get_rng_state, "set_rng_state": f.set_rng_state,
            "get_rng_state_all": f.get_rng_state_all, "set_rng_state_all": f.set_rng_state_all,
        }
        if self.t.native:
            return table
        memory_names = (
            "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
            "memory_cached", "max_memory_cached", "reset_peak_memory_stats",
            "reset_max_memory_allocated", "reset_max_memory_cached",
            "reset_accumulated_memory_stats", "empty_cache", "mem_get_info", "memory_stats",
            "memory_stats_as_nested_dict", "memory_summary", "memory_snapshot",
        )
        random_names = (
            "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
            "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
        )
        table.update({
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "init": lambda: None,
            "is_bf16_supported": f.is_bf16_supported,
            "is_current_stream_capturing": lambda: False,
            "ipc_collect": f.ipc_collect,
            "OutOfMemoryError": torch.OutOfMemoryError,
            "StreamContext": f.stream_context_class(),
            "default_generators": f.default_generators(),
            "amp": self._cuda.amp,
            "nvtx": f.nvtx_namespace(),
            "memory": Namespace("torch.cuda.memory", {n: table[n] for n in memory_names},
                                getattr(self._cuda, "memory", None), self.t),
            "random": Namespace("torch.cuda.random", {n: table[n] for n in random_names},
                                getattr(self._cuda, "random", None), self.t),
        })
        for name, dtype in LEGACY_TYPES.items():
            table[name] = _legacy_type(name, dtype, self.t)
        return table

    # -------------------------------------------------------------- devices
    def device_count(self) -> int:
        """The number of logical devices (the selection's devices)."""
        return self.t.count

    def current_device(self) -> int:
        """The logical current device of this thread."""
        return self.t.current

    def set_device(self, device: Any) -> None:
        """Make logical ``device`` current (and its physical device, for the backend)."""
        if isinstance(device, int) and device < 0:
            return
        logical = self.t.logical_index(device)
        self.t.current = logical
        setter = self._served_by_module("set_device")
        if setter is not None:
            setter(self.t.physical(logical))

    def device_context_class(self) -> type:
        """``torch.cuda.device(i)``: makes logical ``i`` current inside the block (-1/None: no-op)."""
        facade = self

        class device:
            def __init__(self, device: Any):
                none = device is None or (isinstance(device, int) and device < 0)
                self.idx = None if none else facade.t.logical_index(device)
                self.prev_idx = -1

            def __enter__(self):
                if self.idx is not None:
                    self.prev_idx = facade.t.current
                    facade.set_device(self.idx)
                return self

            def __exit__(self, *exc):
                if self.idx is not None:
                    facade.set_device(self.prev_idx)
                return False

        device.__module__ = "torch.cuda"
        return device

    def device_of(self, obj: Any) -> Any:
        """``torch.cuda.device_of(tensor)``: the device context of a tensor on the backend."""
        context = self._table["device"]
        if isinstance(obj, torch.Tensor) and obj.device.type == self.t.device_type and not self._host:
            return context(self.t.logical_index(obj.device))
        return context(None)

    def get_device_name(self, device: Any = None) -> str:
        """The name the backend reports for the device (the probe's, on the CPU)."""
        logical = self.t.logical_index(device)
        getter = self._served_by_module("get_device_name")
        if getter is not None:
            return getter(self.t.physical(logical))
        return self.t.device_names[logical]

    def get_device_properties(self, device: Any = None) -> Any:
        """The backend's device properties; on the CPU a :class:`DeviceProperties` with the
        host's name, memory and core count and no compute capability."""
        logical = self.t.logical_index(device)
        getter = self._served_by_module("get_device_properties")
        if getter is not None:
            return getter(self.t.physical(logical))
        memory = self.t.device_memory[logical] if logical < len(self.t.device_memory) else None
        return DeviceProperties(
            name=self.t.device_names[logical],
            total_memory=memory if memory is not None else host_memory_info()[1],
            multi_processor_count=os.cpu_count() or 1,
        )

    def get_device_capability(self, device: Any = None) -> tuple:
        """The backend's capability if it has the notion, else (0, 0): no CUDA compute
        capability, so code gated on ``>= (8, 0)`` takes its portable path."""
        getter = self._served_by_module("get_device_capability")
        if getter is not None:
            answer = getter(self._phys(device))
            if answer is not None:
                return tuple(answer)
        self.t.logical_index(device)
        return (0, 0)

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        """The backend's answer, else whether it declares bfloat16 its low-precision dtype."""
        check = self._served_by_module("is_bf16_supported")
        if check is not None:
            return bool(check())
        return self.t.low_precision_dtype == torch.bfloat16

    def synchronize(self, device: Any = None) -> None:
        """Wait for the backend's device (the host CPU has nothing to wait for)."""
        phys = self._phys(device)
        sync = self._served_by_module("synchronize")
        if sync is not None:
            sync(phys)

    def ipc_collect(self) -> None:
        """The backend's ``ipc_collect`` if any; the host has no IPC handles to collect."""
        collect = self._served_by_module("ipc_collect")
        if collect is not None:
            collect()

    # -------------------------------------------------------------- streams and events
    def _has_streams(self) -> bool:
        return not self._host and self._mod("Stream") is not None

    def stream_class(self) -> Any:
        """The backend's Stream class (``device=`` logical), or :class:`InlineStream` where it
        has none (CPU)."""
        if not self._has_streams():
            return InlineStream
        real = self._mod("Stream")
        facade = self

        def make(device: Any = None, priority: int = 0, **kwargs: Any) -> Any:
            return real(device=facade._phys(device), priority=priority, **kwargs)

        return alias_class(real, make)

    def event_class(self) -> Any:
        """The backend's Event class, or :class:`HostEvent` where it has none (CPU)."""
        return self._mod("Event") if self._has_streams() else HostEvent

    def stream_context_class(self) -> Any:
        """The backend's StreamContext, or :class:`InlineStreamContext` (CPU)."""
        if self._has_streams():
            return self._mod("StreamContext") or unserved("StreamContext", self.t)
        return InlineStreamContext

    def default_stream(self, device: Any = None) -> Any:
        """The backend's default stream, or one :class:`InlineStream` per logical device."""
        if self._has_streams():
            return self._mod("default_stream")(self._phys(device))
        logical = self.t.logical_index(device)
        if logical not in self._default_streams:
            self._default_streams[logical] = InlineStream(self.t.device_for(logical))
        return self._default_streams[logical]

    def current_stream(self, device: Any = None) -> Any:
        """The backend's current stream; on the CPU the stream of the innermost
        ``torch.cuda.stream(...)`` block, else the default one."""
        if self._has_streams():
            return self._mod("current_stream")(self._phys(device))
        stack = getattr(stream_state, "streams", None)
        return stack[-1] if stack else self.default_stream(device)

    def set_stream(self, stream: Any) -> None:
        """Make ``stream`` current (the backend's ``set_stream``; on the CPU, for this thread)."""
        if self._has_streams():
            self._mod("set_stream")(stream)
        elif stream is not None:
            stream_state.streams = [stream]

    def stream(self, stream: Any) -> Any:
        """``with torch.cuda.stream(s):`` — the backend's context, or (CPU) one that makes
        ``s`` current for the block; work inside still runs inline."""
        if self._has_streams():
            return self._mod("stream")(stream)
        return InlineStreamContext(stream)

    # -------------------------------------------------------------- memory
    def _memory(self, name: str, device: Any, default: Any) -> Any:
        fn = self._served_by_module(name)
        if fn is None:
            self.t.logical_index(device)
            return default
        return fn(self._phys(device))

    def memory_allocated(self, device: Any = None) -> int:
        """The backend's count; 0 on the CPU (no device allocator, nothing held for a device)."""
        return self._memory("memory_allocated", device, 0)

    def memory_reserved(self, device: Any = None) -> int:
        """The backend's count; 0 on the CPU."""
        return self._memory("memory_reserved", device, 0)

    def max_memory_allocated(self, device: Any = None) -> int:
        """The backend's peak; 0 on the CPU."""
        return self._memory("max_memory_allocated", device, 0)

    def max_memory_reserved(self, device: Any = None) -> int:
        """The backend's peak; 0 on the CPU."""
        return self._memory("max_memory_reserved", device, 0)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        """The backend's reset; nothing to reset on the CPU."""
        return self._memory("reset_peak_memory_stats", device, None)

    def reset_accumulated_memory_stats(self, device: Any = None) -> None:
        """The backend's reset; nothing to reset on the CPU."""
        return self._memory("reset_accumulated_memory_stats", device, None)

    def memory_stats(self, device: Any = None) -> dict:
        """The backend's statistics; an empty dict on the CPU."""
        return self._memory("memory_stats", device, {})

    def memory_snapshot(self, *args: Any, **kwargs: Any) -> list:
        """The backend's snapshot; an empty list on the CPU."""
        fn = self._served_by_module("memory_snapshot")
        return fn(*args, **kwargs) if fn is not None else []

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        """The backend's summary; on the CPU a line saying there are no allocator statistics."""
        fn = self._served_by_module("memory_summary")
        if fn is not None:
            return fn(self._phys(device), abbreviated)
        logical = self.t.logical_index(device)
        return f"backend {self.t.backend!r} (cuda:{logical}): the host CPU keeps no allocator statistics\n"

    def empty_cache(self) -> None:
        """The backend's ``empty_cache``; the host has no device cache."""
        fn = self._served_by_module("empty_cache")
        if fn is not None:
            fn()

    def mem_get_info(self, device: Any = None) -> tuple:
        """(free, total) bytes of the device; on the CPU of host memory (MemAvailable, MemTotal)."""
        fn = self._served_by_module("mem_get_info")
        if fn is not None:
            return tuple(fn(self._phys(device)))
        self.t.logical_index(device)
        return host_memory_info()

    # -------------------------------------------------------------- random numbers
    # On the CPU backend every logical device has the one CPU generator. Elsewhere the device
    # module's own functions answer (all device modules have manual_seed, get_rng_state...).
    def _rng(self, name: str) -> Optional[Callable]:
        return self._served_by_module(name)

    def default_generators(self) -> Any:
        """One generator per logical device (all the CPU generator on the CPU backend); an
        unserved stand-in where the device module exposes no generators."""
        if self._host:
            return tuple(torch.default_generator for _ in self.t.devices)
        generators = self._mod("default_generators")
        if generators is None:
            return unserved("default_generators", self.t)
        return tuple(generators[p] for p in self.t.devices)

    def manual_seed(self, seed: int) -> None:
        """Seed the current device's generator (on the CPU backend, the CPU generator)."""
        if self._host:
            torch.default_generator.manual_seed(int(seed))
        else:
            self.set_device(self.t.current)
            self._rng("manual_seed")(int(seed))

    def manual_seed_all(self, seed: int) -> None:
        """Seed every device's generator."""
        if self._host:
            torch.default_generator.manual_seed(int(seed))
        else:
            self._rng("manual_seed_all")(int(seed))

    def seed(self) -> None:
        """Seed the current device's generator with a random number."""
        if self._host:
            torch.default_generator.seed()
        else:
            self._rng("seed")()

    def seed_all(self) -> None:
        """Seed every device's generator with a random number."""
        if self._host:
            torch.default_generator.seed()
        else:
            self._rng("seed_all")()

    def initial_seed(self) -> int:
        """The current device generator's initial seed."""
        if self._host:
            return torch.default_generator.initial_seed()
        return self._rng("initial_seed")()

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        """The generator state of ``device`` (a ByteTensor)."""
        if self._host:
            self.t.logical_index(device)
            return torch.default_generator.get_state()
        return self._rng("get_rng_state")(self._phys(device))

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
        """Restore the generator state of ``device``."""
        if self._host:
            self.t.logical_index(device)
            torch.default_generator.set_state(new_state.cpu())
        else:
            self._rng("set_rng_state")(new_state, self._phys(device))

    def get_rng_state_all(self) -> list:
        """The generator states of every logical device."""
        return [self.get_rng_state(i) for i in range(self.t.count)]

    def set_rng_state_all(self, new_states: Any) -> None:
        """Restore every logical device's generator state, in order."""
        for logical, state in enumerate(new_states):
            self.set_rng_state(state, logical)

    # -------------------------------------------------------------- nvtx
    def nvtx_namespace(self) -> Namespace:
        """``torch.cuda.nvtx``: the backend's when it has one, else no-ops."""

        def range_push(msg: str) -> int:
            return 0

        def range_pop() -> int:
            return 0

        def range_start(msg: str) -> int:
            return 0

        def range_end(range_id: int) -> None:
            return None

        def mark(msg: str) -> None:
            return None

        @contextlib.contextmanager
        def range(msg: str, *args: Any, **kwargs: Any):
            yield

        served = dict(range_push=range_push, range_pop=range_pop, range_start=range_start,
                      range_end=range_end, mark=mark, range=range)
        own = self._served_by_module("nvtx")
        if own is not None:
            served = {name: getattr(own, name, fn) for name, fn in served.items()}
        return Namespace("torch.cuda.nvtx", served, None, self.t)


@patch_function("torch_cuda", on_cuda=True)
def patch_torch_cuda(target: Target, patcher: Patcher) -> None:
    """``torch.cuda.*`` answered by the backend (a class swap on the module; see module doc)."""
    cuda = torch.cuda
    facade = CudaFacade(target, cuda)
    patcher.setitem(_active, "facade", facade)
    patcher.set_module_class(cuda, _FacadeModule)


@patch_function("torch_backends_cuda")
def patch_backends_cuda(target: Target, patcher: Patcher) -> None:
    """``torch.backends.cuda`` / ``torch.backends.cudnn`` flags (``benchmark``,
    ``deterministic``, ``matmul.allow_tf32``, sdp switches) keep working as plain flags;
    CUDA-only objects (``cufft_plan_cache``, BLAS library choice) raise on use, naming the backend."""
    module = torch.backends.cuda
    stand_ins = {n: unserved(n, target, "torch.backends.cuda") for n in _BackendsCudaModule.DENIED}
    patcher.setitem(_active, "backends_cuda", stand_ins)
    patcher.set_module_class(module, _BackendsCudaModule)


@patch_function("legacy_tensor_type")
def patch_tensor_type(target: Target, patcher: Patcher) -> None:
    """``x.type(torch.cuda.FloatTensor)`` and ``x.type("torch.cuda.FloatTensor")``: the dtype
    on the target device; every other use of ``Tensor.type`` is the original."""
    original = torch.Tensor.type

    def type(self, dtype=None, non_blocking=False, **kwargs):
        name = None
        if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
            name = dtype[len("torch.cuda."):]
        elif dtype is not None and getattr(dtype, "__module__", None) == "torch.cuda":
            name = getattr(dtype, "__name__", None)
        if name in LEGACY_TYPES:
            return self.to(target.translate("cuda"), LEGACY_TYPES[name], non_blocking=non_blocking)
        return original(self, dtype, non_blocking, **kwargs)

    type.__doc__ = original.__doc__
    patcher.setattr(torch.Tensor, "type", type)
