"""The answers of ``torch.cuda.*`` for one :class:`~.devices.Target` (see :mod:`.cuda_api` for
how the facade is put in front of the real module).

Every answer comes from the chip's device module (``Backend.device_module``: ``torch.npu``,
``torch.sim``, the host runtime of the cpu backend); where a module lacks a function the answer
is the honest equivalent, documented per function. Device arguments are logical (``cuda:i`` /
``i``) and reach the module as the physical index ``target.devices[i]``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import sys
import threading
import types
from typing import Any, Callable, Dict, Iterable

import torch

from .. import compat
from ..tables.device_modules import missing_uses
from ..machine.host import DeviceProperties, HostRuntime
from ..machine.pools import real
from ..errors import suggestion
from .devices import Target
from .standins import DENIED_PRIVATE, Namespace, alias_class, unserved

#: the legacy ``torch.cuda.<X>Tensor`` types and their dtypes (torch's own CPU tensor types)
LEGACY_TYPES = {c.__name__: c.dtype for c in torch._tensor_classes if c.__module__ == "torch"}
_INLINE_STREAMS = HostRuntime()
#: ``torch.Stream`` as torch defines it (the ``stream_event_devices`` patch replaces the name)
_TORCH_STREAM = getattr(torch, "Stream", None)
#: top-level packages that load CUDA kernels when ``torch.cuda.is_available()`` says True
#: (bitsandbytes then reaches for ``torch._C._cuda_getCurrentRawStream``): they are told the truth
CUDA_KERNEL_PACKAGES = (
    "bitsandbytes", "flash_attn", "flash_attn_2_cuda", "xformers", "apex", "triton",
    "transformer_engine", "mamba_ssm", "causal_conv1d", "vllm", "deepspeed", "fbgemm_gpu",
    "auto_gptq", "awq", "exllamav2", "liger_kernel",
)
#: what :meth:`CudaFacade.lookup` returns for a name the real ``torch.cuda`` answers
PASS = object()


class ThreadDepth(threading.local):
    """A per-thread mark: ``with mark:`` blocks nest, and ``mark.depth`` is how many of them this
    thread is inside (a class default, so that reading it in a thread that never entered one is
    a plain attribute read, not a caught AttributeError)."""

    depth = 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc_info: Any) -> None:
        self.depth -= 1


#: inside it, the facade gives this thread the real ``torch.cuda``'s answers to
#: ``is_available()`` and ``device_count()``: ``torch.accelerator`` (which stays truthful) asks
#: them of ``torch.get_device_module("cuda")`` on a CUDA build of torch, and that is the facade
#: (the ``accelerator_asks_real_cuda`` patch wraps its functions in it)
asked_by_torch_accelerator = ThreadDepth()


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


class CudaFields:
    """A chip's device properties read through ``torch.cuda``: the chip's own attributes, with
    ``major`` / ``minor`` the capability ``torch.cuda.get_device_capability()`` reports, and for
    the fields of CUDA's properties it lacks, :class:`DeviceProperties`' defaults. torch itself
    reads them there (Inductor keys its cache on ``torch.cuda.get_device_properties().gcnArchName``
    when ``torch.version.cuda`` is None), so a missing field would fail ``torch.compile``."""

    _DEFAULTS = {f.name: f.default for f in dataclasses.fields(DeviceProperties)
                 if f.default is not dataclasses.MISSING}

    def __init__(self, props: Any, capability: tuple):
        self._props = props
        self._capability = dict(zip(("major", "minor"), capability))

    def __getattr__(self, name: str) -> Any:
        if name in self._capability:
            return self._capability[name]
        try:
            return getattr(self._props, name)
        except AttributeError:
            if name in self._DEFAULTS:
                return self._DEFAULTS[name]
            raise

    def __repr__(self) -> str:
        return repr(self._props)


class CudaFacade:
    """The answers of ``torch.cuda.*`` for one :class:`Target`. On a CUDA backend (only reached
    when ``gpu_ids`` renumbers devices) just the index-taking functions are served; everything
    else is the real ``torch.cuda``."""

    def __init__(self, target: Target, cuda_module: types.ModuleType,
                 cuda_kernel_packages: Iterable[str] = ()):
        self.t = target
        self._cuda = cuda_module
        self._cuda_kernel_packages = frozenset(CUDA_KERNEL_PACKAGES) | frozenset(cuda_kernel_packages)
        self._table = self.served()

    # -------------------------------------------------------------- plumbing
    def _mod(self, name: str) -> Any:
        """The backend module's attribute ``name`` (None when it has none). On a CUDA backend
        this reads the real ``torch.cuda`` past the facade."""
        return real(self.t.module, name)

    def _mod_or_counterpart(self, name: str) -> Any:
        """The backend module's ``name``, else its counterpart's (``Backend.cuda_counterparts``:
        ``torch.npu.mstx`` for ``nvtx``), else for a CUDA-named class the module's class named
        for its device type as the vendors name theirs (``CUDAGraph``: ``torch.sim.SIMGraph``);
        None when it has none of them."""
        found = self._mod(name)
        if found is None and name in self.t.chip.cuda_counterparts:
            found = self._mod(self.t.chip.cuda_counterparts[name])
        if found is None and name.startswith("CUDA"):
            found = self._mod(self.t.device_type.upper() + name[len("CUDA"):])
        return found

    def _phys(self, device: Any = None) -> int:
        return self.t.physical(self.t.logical_index(device))

    def lookup(self, name: str) -> Any:
        """The value of ``torch.cuda.<name>``, or ``PASS`` for the real module's. In order: a
        served name; a private name (torch's own plumbing); AttributeError for a name the real
        ``torch.cuda`` does not have either (as without this package, with the closest name);
        the real submodule for ``torch.cuda``'s submodules (``streams``, ``jiterator``,
        ``graphs``...: a CPU-only torch imports and uses them, and they fail only when work
        reaches a CUDA device); the backend module's function of that name; else an unserved
        stand-in."""
        found = self._table.get(name, PASS)
        if found is not PASS:
            return found
        if self.t.cuda_itself or (name.startswith("_") and name not in DENIED_PRIVATE):
            return PASS
        try:
            real = types.ModuleType.__getattribute__(self._cuda, name)
        except AttributeError:
            raise AttributeError(f"module 'torch.cuda' has no attribute {name!r}."
                                 f"{suggestion(name, [*dir(self._cuda), *self._table])}") from None
        if isinstance(real, types.ModuleType) and real.__name__.startswith("torch.cuda."):
            return PASS
        if not name.startswith("_"):
            delegate = self._mod_or_counterpart(name)
            if delegate is not None:
                return delegate
        stand_in = self._table[name] = self._unserved(name, real)
        return stand_in

    def _unserved(self, name: str, real: Any) -> type:
        """The stand-in for a name the backend's module cannot answer. Where the chip's device
        module table (``Backend.device_module_table``) lacks the name and its counterpart, the
        error names the chip and its module, and each use is counted for the verdict
        (:data:`~flagos_torchfl.tables.device_modules.missing_uses`); where the chip has it
        but this backend's module does not (a sim profile), the error says so. The stand-in
        carries ``real``'s introspection (the ``torch.cuda`` object it stands for)."""
        table = self.t.chip.device_module_table()
        if table is None or name.startswith("_"):
            return unserved(name, self.t, real=real)
        counterpart = self.t.chip.cuda_counterparts.get(name)
        theirs = next((n for n in (counterpart, name) if n in table.names), None)
        if theirs is not None:
            why = f"{table.chip} has {table.device_module}.{theirs}, but this backend's device module does not provide it"
            return unserved(name, self.t, reason=(f"backend {self.t.chip_name!r}", why), real=real)
        also = f" (nor {counterpart})" if counterpart else ""
        why = f"{table.device_module} of {table.origin} has no {name}{also}"
        return unserved(name, self.t, reason=(table.chip, why),
                        on_use=lambda: missing_uses.record(table.chip, name), real=real)

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
        if self.t.cuda_itself:
            return table
        # the real submodules' names (while the facade is active torch.cuda.memory is its namespace)
        memory_names = [n for n in importlib.import_module("torch.cuda.memory").__all__ if n in table]
        random_names = [n for n in importlib.import_module("torch.cuda.random").__all__ if n in table]
        table.update({
            "is_available": f.is_available,
            "is_initialized": f.is_initialized, "init": f.init,
            "is_bf16_supported": f.is_bf16_supported,
            "is_tf32_supported": f.is_tf32_supported,
            "get_arch_list": f.get_arch_list, "get_gencode_flags": f.get_gencode_flags,
            "is_current_stream_capturing": f.is_current_stream_capturing,
            "ipc_collect": f.ipc_collect,
            "OutOfMemoryError": compat.out_of_memory_error(),
            "StreamContext": f.stream_context_class(),
            "default_generators": f.default_generators(),
            "amp": self._cuda.amp,
            "nvtx": f.nvtx_namespace(),
            "nccl": f.nccl_namespace(),
            "memory": Namespace("torch.cuda.memory", {n: table[n] for n in memory_names},
                                getattr(self._cuda, "memory", None), self.t, self._mod_or_counterpart),
            "random": Namespace("torch.cuda.random", {n: table[n] for n in random_names},
                                getattr(self._cuda, "random", None), self.t, self._mod_or_counterpart),
        })
        for name, dtype in LEGACY_TYPES.items():
            table[name] = _legacy_type(name, dtype, self.t)
        return table

    # -------------------------------------------------------------- devices
    def is_available(self, _frame: Callable = sys._getframe) -> bool:
        """True, except for callers inside a package that loads CUDA kernels when CUDA is
        available (``CUDA_KERNEL_PACKAGES`` and ``FL_CUDA_KERNEL_PACKAGES``): those are told the
        truth, so they stay on their CPU path instead of reaching for CUDA's runtime — an answer
        that depends on who asks, so the caller's module is read. So is ``torch.accelerator``,
        which stays truthful (:func:`asked_by_torch_accelerator`): on a CUDA build of torch without
        a GPU, ``current_accelerator(check_available=True)`` (AdamW's step asks it) stays None."""
        if asked_by_torch_accelerator.depth:
            return types.ModuleType.__getattribute__(self._cuda, "is_available")()
        return not self.loads_cuda_kernels(_frame(1).f_globals.get("__name__"))

    def loads_cuda_kernels(self, module_name: Any) -> bool:
        """Whether the module ``module_name`` belongs to a package that loads CUDA kernels when
        told CUDA is there (``CUDA_KERNEL_PACKAGES`` and ``FL_CUDA_KERNEL_PACKAGES``)."""
        return (module_name or "").partition(".")[0] in self._cuda_kernel_packages

    def device_count(self) -> int:
        """The number of logical devices (the selection's devices); ``torch.accelerator`` gets the
        real count (on a CUDA build of torch without a GPU, 0), as its other answers are real
        (:func:`asked_by_torch_accelerator`)."""
        if asked_by_torch_accelerator.depth:
            return types.ModuleType.__getattribute__(self._cuda, "device_count")()
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
        setter = self._mod("set_device")
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
        if isinstance(obj, torch.Tensor) and obj.device.type == self.t.device_type:
            return context(self.t.logical_index(obj.device))
        return context(None)

    def get_device_name(self, device: Any = None) -> str:
        """The name the backend reports for the device (else the probe's)."""
        logical = self.t.logical_index(device)
        getter = self._mod("get_device_name")
        if getter is not None:
            return getter(self.t.physical(logical))
        return self.t.device_names[logical]

    def get_device_properties(self, device: Any = None) -> Any:
        """The backend's device properties, with CUDA's fields it lacks and ``major`` /
        ``minor`` as :meth:`get_device_capability` answers (:class:`CudaFields`); where its
        module has none, the probe's name and memory. On a CUDA backend, CUDA's own."""
        logical = self.t.logical_index(device)
        getter = self._mod("get_device_properties")
        if self.t.cuda_itself:
            return getter(self.t.physical(logical))
        capability = self.get_device_capability(logical)
        if getter is not None:
            return CudaFields(getter(self.t.physical(logical)), capability)
        memory = self.t.device_memory[logical] if logical < len(self.t.device_memory) else None
        return DeviceProperties(name=self.t.device_names[logical], total_memory=memory or 0,
                                multi_processor_count=1, major=capability[0], minor=capability[1])

    def get_device_capability(self, device: Any = None) -> tuple:
        """Off NVIDIA, the capability whose CUDA features the chip serves
        (``Backend.cuda_capability``): (8, 0) where it computes bfloat16, else (7, 0), so code
        gated on ``>= (8, 0)`` (bfloat16, TF32, fused kernels, attention backends) takes the
        path the chip runs. A vendor module's own answer is not passed on: torch_npu answers
        None, torch_mlu its architecture's (3, x), which CUDA code reads as a Kepler GPU. On a
        CUDA backend, CUDA's own."""
        if self.t.cuda_itself:
            return tuple(self._mod("get_device_capability")(self._phys(device)))
        self.t.logical_index(device)
        return tuple(self.t.chip.cuda_capability(self.is_bf16_supported()))

    def is_initialized(self) -> bool:
        """Whether the backend's runtime has initialised in this process: the device module's
        answer (False until first use on the sim and the vendors' modules, as CUDA's, so that
        code that sets the device only if nothing has, like ``DeviceMesh``, sets it); True for a
        backend whose module does not say (the host)."""
        check = self._mod("is_initialized")
        return bool(check()) if callable(check) else True

    def init(self) -> None:
        """Initialise the backend's runtime now (its module's ``init``; nothing for the host)."""
        start = self._mod("init")
        if callable(start):
            start()

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        """Whether the chip computes bfloat16 (``Target.computes_bfloat16``)."""
        return self.t.computes_bfloat16()

    def is_tf32_supported(self) -> bool:
        """The backend's answer (torch_musa has one), else the chip's declaration
        (``Backend.supports_tf32``; a sim profile's chip model): False on a chip without TF32
        (Ascend's TF32-like mode is HF32, ``torch.npu.matmul.allow_hf32``)."""
        check = self._mod("is_tf32_supported")
        if check is not None:
            return bool(check())
        return bool(self.t.chip.supports_tf32)

    def get_arch_list(self) -> list:
        """The CUDA architectures this torch runs kernels for on the chip: none off NVIDIA."""
        return []

    def get_gencode_flags(self) -> str:
        """The nvcc ``-gencode`` flags of :meth:`get_arch_list`'s architectures: none."""
        return ""

    def synchronize(self, device: Any = None) -> None:
        """Wait for the backend's device (the host CPU has nothing to wait for)."""
        phys = self._phys(device)
        sync = self._mod("synchronize")
        if sync is not None:
            sync(phys)

    def is_current_stream_capturing(self) -> bool:
        """Whether a graph capture is underway on the current stream: the backend module's
        answer (False where it has no graphs)."""
        check = self._mod("is_current_stream_capturing")
        return bool(check()) if callable(check) else False

    def ipc_collect(self) -> None:
        """The backend's ``ipc_collect`` if any; the host has no IPC handles to collect."""
        collect = self._mod("ipc_collect")
        if collect is not None:
            collect()

    # -------------------------------------------------------------- streams and events
    def _streams(self) -> Any:
        """What answers the stream functions: the device module, or inline host streams
        (:class:`~flagos_torchfl.machine.host.HostRuntime`) where the module has none."""
        has_streams = self._mod("Stream") is not None and self._mod("Event") is not None
        return self.t.module if has_streams else _INLINE_STREAMS  # torch 2.1's torch.cpu: no Event

    def inline_streams(self) -> Any:
        """What answers the stream functions when its streams are not ``torch.Stream`` (the
        host's and the Python sim's inline streams), else None."""
        streams = self._streams()
        return None if _TORCH_STREAM is not None and issubclass(streams.Stream, _TORCH_STREAM) else streams

    def stream_class(self) -> Any:
        """The backend's Stream class, constructed with a logical ``device=``."""
        real = self._streams().Stream
        facade = self

        def make(device: Any = None, priority: int = 0, **kwargs: Any) -> Any:
            return with_handle(real(device=facade._phys(device), priority=priority, **kwargs))

        return alias_class(real, make)

    def event_class(self) -> Any:
        """The backend's Event class (host-time events where it has none)."""
        return self._streams().Event

    def stream_context_class(self) -> Any:
        """The backend's StreamContext (an unserved stand-in where it has streams but no
        StreamContext)."""
        return getattr(self._streams(), "StreamContext", None) or unserved("StreamContext", self.t)

    def default_stream(self, device: Any = None) -> Any:
        """The default stream of the device."""
        return with_handle(self._streams().default_stream(self._phys(device)))

    def current_stream(self, device: Any = None) -> Any:
        """The current stream of the device (inline streams: the stream of the innermost
        ``torch.cuda.stream(...)`` block of this thread, else the default one)."""
        return with_handle(self._streams().current_stream(self._phys(device)))

    def set_stream(self, stream: Any) -> None:
        """Make ``stream`` current."""
        self._streams().set_stream(stream)

    def stream(self, stream: Any) -> Any:
        """``with torch.cuda.stream(s):`` — the backend's context (inline streams: ``s`` is
        current for the block; work inside still runs inline)."""
        return self._streams().stream(stream)

    # -------------------------------------------------------------- memory
    def memory_snapshot(self, *args: Any, **kwargs: Any) -> list:
        """The backend's snapshot; an empty list on the CPU."""
        fn = self._mod("memory_snapshot")
        return fn(*args, **kwargs) if fn is not None else []

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        """The backend's summary (a line saying there are no allocator statistics where its
        module has none)."""
        fn = self._mod("memory_summary")
        if fn is not None:
            return fn(self._phys(device), abbreviated)
        logical = self.t.logical_index(device)
        return f"backend {self.t.chip_name!r} (cuda:{logical}): no allocator statistics\n"

    def empty_cache(self) -> None:
        """The backend's ``empty_cache`` (on the cpu backend, the C heap's free pages go back)."""
        fn = self._mod("empty_cache")
        if fn is not None:
            fn()

    def mem_get_info(self, device: Any = None) -> tuple:
        """(free, total) bytes of the device (on the cpu backend, of host memory)."""
        fn = self._mod("mem_get_info")
        if fn is None:
            raise unserved("mem_get_info", self.t)._error()
        return tuple(fn(self._phys(device)))

    # -------------------------------------------------------------- random numbers
    def default_generators(self) -> Any:
        """One generator per logical device; an unserved stand-in where the device module
        exposes no generators."""
        generators = self._mod("default_generators")
        if generators is None:
            return unserved("default_generators", self.t)
        return tuple(generators[p] for p in self.t.devices)

    def manual_seed(self, seed: int) -> None:
        """Seed the current device's generator (making the backend's current device the logical
        current one's first, only where it differs: setting a device is a first use)."""
        current = self._mod("current_device")
        if current is None or current() != self.t.physical(self.t.current):
            self.set_device(self.t.current)
        self._mod("manual_seed")(int(seed))

    def manual_seed_all(self, seed: int) -> None:
        """Seed every device's generator."""
        self._mod("manual_seed_all")(int(seed))

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        """The generator state of ``device`` (a ByteTensor)."""
        return self._mod("get_rng_state")(self._phys(device))

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
        """Restore the generator state of ``device``."""
        self._mod("set_rng_state")(new_state, self._phys(device))

    def get_rng_state_all(self) -> list:
        """The generator states of every logical device."""
        return [self.get_rng_state(i) for i in range(self.t.count)]

    def set_rng_state_all(self, new_states: Any) -> None:
        """Restore every logical device's generator state, in order."""
        for logical, state in enumerate(new_states):
            self.set_rng_state(state, logical)

    # -------------------------------------------------------------- nccl
    def nccl_namespace(self) -> Namespace:
        """``torch.cuda.nccl``: ``is_available(tensors)`` — whether the chip's collective
        library takes them (tensors on the chip, the library registered with torch.distributed);
        ``version()`` — NCCL's version, which off NVIDIA is none: ``(0, 0, 0)``, so gates on an
        NCCL release stay closed (the chip's collective library is not NCCL; where its device
        module has a counterpart, ``Backend.cuda_counterparts["nccl"]``, its version). NCCL's
        own collectives (``all_reduce``...) raise on use, naming the backend: use
        ``torch.distributed``, whose ``"nccl"`` means the chip's library."""
        own = self._mod(self.t.chip.cuda_counterparts["nccl"]) if "nccl" in self.t.chip.cuda_counterparts else None
        facade = self

        def is_available(tensors: Any) -> bool:
            import torch.distributed as dist

            tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            on_chip = all(isinstance(x, torch.Tensor) and x.device.type == facade.t.device_type for x in tensors)
            return on_chip and dist.is_available() and dist.is_backend_available(facade.t.collective)

        def version() -> tuple:
            found = getattr(own, "version", None)
            return tuple(found()) if callable(found) else (0, 0, 0)

        return Namespace("torch.cuda.nccl", dict(is_available=is_available, version=version),
                         getattr(self._cuda, "nccl", None), self.t)

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
        own = self._mod_or_counterpart("nvtx")
        if own is not None:
            served = {name: getattr(own, name, fn) for name, fn in served.items()}
        return Namespace("torch.cuda.nvtx", served, None, self.t)

    # ------------------------------------------------------------------ memory and random
    def _memory_query(self, name: str, device: Any, empty: Any) -> Any:
        """The backend's ``name`` of logical ``device`` (None: the current one); ``empty`` where
        its module has none (the device is still checked)."""
        found = self._mod(name)
        if found is None:
            self.t.logical_index(device)
            return empty
        return found(self._phys(device))

    def memory_allocated(self, device: Any = None) -> int:
        """The backend's ``memory_allocated`` of logical ``device``; 0 where its module has none."""
        return self._memory_query("memory_allocated", device, 0)

    def memory_reserved(self, device: Any = None) -> int:
        """The backend's ``memory_reserved`` of logical ``device``; 0 where its module has none."""
        return self._memory_query("memory_reserved", device, 0)

    def max_memory_allocated(self, device: Any = None) -> int:
        """The backend's ``max_memory_allocated`` of logical ``device``; 0 where its module has none."""
        return self._memory_query("max_memory_allocated", device, 0)

    def max_memory_reserved(self, device: Any = None) -> int:
        """The backend's ``max_memory_reserved`` of logical ``device``; 0 where its module has none."""
        return self._memory_query("max_memory_reserved", device, 0)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        """The backend's ``reset_peak_memory_stats`` of logical ``device``; nothing where its module has none."""
        return self._memory_query("reset_peak_memory_stats", device, None)

    def reset_accumulated_memory_stats(self, device: Any = None) -> None:
        """The backend's ``reset_accumulated_memory_stats`` of logical ``device``; nothing where its
        module has none."""
        return self._memory_query("reset_accumulated_memory_stats", device, None)

    def memory_stats(self, device: Any = None) -> dict:
        """The backend's ``memory_stats`` of logical ``device``; ``{}`` where its module has none."""
        return self._memory_query("memory_stats", device, {})

    def seed(self) -> None:
        """The backend's ``seed()``: the current device's generator seeded with a random number."""
        return self._mod("seed")()

    def seed_all(self) -> None:
        """The backend's ``seed_all()``: every device's generator seeded with a random number."""
        return self._mod("seed_all")()

    def initial_seed(self) -> int:
        """The backend's ``initial_seed()``: the current generator's initial seed."""
        return self._mod("initial_seed")()


@functools.lru_cache(maxsize=None)
def handle_stream_class() -> type:
    """A ``torch.Stream`` of the backend with ``cuda_stream``, the raw handle CUDA code passes to
    its own kernels and libraries: the stream's id (0 for a device's default stream). Made from
    a stream, it is the same stream (equal: same device and id)."""

    class HandleStream(torch.Stream):
        __doc__ = handle_stream_class.__doc__

        @property
        def cuda_stream(self) -> int:
            return self.stream_id

    return HandleStream


def with_handle(stream: Any) -> Any:
    """``stream`` as ``torch.cuda`` hands streams out: a ``torch.Stream`` gets ``cuda_stream``
    (:func:`handle_stream_class`); other streams (the inline ones) have their own."""
    if compat.has("stream_event") and type(stream) is _TORCH_STREAM:
        return handle_stream_class()(stream_id=stream.stream_id, device_index=stream.device_index,
                                     device_type=stream.device_type)
    return stream
