"""The shape every chip family fills in: what it is, its answers to the probe's steps
(:mod:`.probing` runs them), and every answer that differs from one chip to another
(:mod:`.activation` starts it).

The layers above ask a :class:`Backend`; they never test a backend's name. A backend module
knows nothing of patches or routing: it answers questions about one kind of chip.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from types import MappingProxyType
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Protocol, Tuple

from ..machine import environment as _environment
from ..machine import pools as _memory
from ..machine import probing as _probing
from ..machine.probing import DeviceInfo, ProbeResult, Unavailable
from ..selection_view import SelectionView

__all__ = ["Backend", "DeviceInfo", "KubernetesDevices", "NativeCalls", "ProbeResult", "Unavailable"]


@dataclasses.dataclass(frozen=True)
class KubernetesDevices:
    """How a Kubernetes cluster offers the chip (read by :mod:`flagos_torchfl.k8s`)."""

    #: the extended resources the chip's device plugins advertise, the usual one first (``k8s
    #: job`` requests it unless told another); empty: no device plugin, the pods request no device
    resources: Tuple[str, ...] = ()
    #: variables a container needs to see every device of its node without requesting one (the
    #: node-labelling DaemonSet of ``k8s daemonset``)
    probe_env: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))


class NativeCalls(Protocol):
    """A count of a chip's native operator calls (:meth:`Backend.count_native_calls`)."""

    def rows(self) -> Dict[str, List[int]]:
        """``{overload: [calls, nanoseconds]}`` counted so far (after :meth:`stop` too)."""

    def pause(self, paused: bool) -> None:
        """The calling thread begins (True) or ends (False) running a route: its calls in
        between are the route's work, not counted."""

    def stop(self) -> None:
        """Stop counting."""


class Backend:
    """One chip family. Subclasses set the class attributes and override the probe steps."""

    name: str = ""
    vendor: str = ""
    aliases: Tuple[str, ...] = ()
    device_type: str = ""
    dispatch_key: str = ""
    collective: str = ""
    low_precision_dtype: str = "bfloat16"
    supports_float64: bool = True
    priority: int = 0
    auto_selectable: bool = True
    #: the vendor's PyTorch plugin, imported lazily by the probe (None: built into torch)
    plugin_module: Optional[str] = None
    #: plugin versions this package has been tested with (empty: none yet)
    tested_plugin_versions: Tuple[str, ...] = ()
    #: the vendor's query tool and the regex that finds the driver version in its output
    query_tool: Optional[Tuple[str, ...]] = None
    driver_pattern: str = ""
    #: the vendor's equivalent of CUDA_VISIBLE_DEVICES (None: CUDA_VISIBLE_DEVICES itself)
    visible_devices_env: Optional[str] = None
    #: the variable that sets how many logical devices the backend presents (cpu, sim); None:
    #: the devices are the hardware's
    devices_env: Optional[str] = None
    #: operators the chip has natively but not for some dtypes: dtype name -> operator names
    #: (semantic names, categories or ATen names; "*": every native operator), e.g.
    #: ``{"float64": ("matmul", "aten::cumsum")}``. Routing gives them a route for those dtypes.
    dtype_gaps: Mapping[str, Tuple[str, ...]] = MappingProxyType({})
    #: the variables the chip's caching allocator reads its options from when its runtime starts,
    #: in the order it reads them (the first one set wins); ``FL_EXPANDABLE_SEGMENTS=1`` adds
    #: ``expandable_segments:True`` to the one it reads. Empty: no such options
    allocator_conf_env: Tuple[str, ...] = ()
    #: whether pinned host memory means anything here (False: ``pin_memory()`` is a no-op)
    pins_memory: bool = True
    #: whether factories can allocate pinned memory (``torch.empty(..., pin_memory=True)``);
    #: False: they allocate, then pin with ``Tensor.pin_memory()``
    pins_at_allocation: bool = True
    #: whether process groups and DDP are bound to one device (False: ``device_id`` / DDP
    #: ``device_ids`` are dropped, as for CPU modules)
    binds_process_group_device: bool = True
    #: ``ReduceOp`` reductions the chip's collective library lacks (``"PREMUL_SUM"``: NCCL has it,
    #: HCCL does not); a staged library (the sim's) that lacks what the chip's has runs it at
    #: ``torch.distributed``'s entry points (:meth:`runs_premul_sum_at_entry`)
    collective_lacks: Tuple[str, ...] = ()
    #: whether DeepSpeed gets its accelerator from this package (where DeepSpeed has none of its
    #: own for the chip); False: DeepSpeed's own detection picks it (torch_npu, torch_mlu, CUDA)
    provides_deepspeed_accelerator: bool = False
    #: whether operators can be missing here (False: the chip runs every ATen operator)
    routes_operators: bool = True
    #: kernel libraries (provider names, e.g. ``"flaggems"``) that may serve this chip
    kernel_libraries: Tuple[str, ...] = ()
    #: whether the chip runs Triton kernels (a Triton backend of its vendor's: triton-ascend,
    #: Cambricon's and Moore Threads' Triton, Intel's XPU backend); False: a library's Triton
    #: kernels (``triton_op``, ``wrap_triton``) are refused on its tensors, naming the reason
    runs_triton: bool = False
    #: the ``torch.profiler.ProfilerActivity`` that records this chip's work (None: host only)
    profiler_activity: Optional[str] = None
    #: whether the chip computes TF32 (``torch.cuda.is_tf32_supported()`` where its device
    #: module has no answer of its own)
    supports_tf32: bool = False
    #: how a Kubernetes cluster offers the chip (its device plugins' resources, the probe's env)
    kubernetes: KubernetesDevices = KubernetesDevices()
    #: ``torch.cuda`` names whose counterpart in the chip's device module has another name
    #: (``{"CUDAGraph": "NPUGraph", "nvtx": "mstx"}``); the facade answers them with it
    cuda_counterparts: Mapping[str, str] = MappingProxyType({})
    #: whether the redirect must resolve the chip's own device type without an index (``"sim"``)
    #: to the device module's current device itself, because the chip's C++ device guard cannot
    #: (a Python-registered PrivateUse1 backend); False: it is passed on unchanged, and the
    #: chip resolves it when it is used (no early runtime start, no ``current_device()`` asked)
    resolves_unindexed_device: bool = False

    # ----------------------------------------------------------------- probing
    # the steps of the probe procedure (:func:`.probing.run`), which a chip overrides where its
    # answer differs
    def probe(self, timeout: Optional[float] = None, count_ops: bool = True, query_tools: bool = True,
              driver: Optional[Tuple[Optional[str], Optional[str]]] = None) -> ProbeResult:
        """Whether this backend can run here (:func:`.probing.run`): never raises, never hangs."""
        return _probing.run(self, timeout, count_ops, query_tools, driver)

    def plugin_found(self) -> bool:
        """Whether the vendor plugin is installed (found, not imported); True for none needed."""
        return _probing.plugin_found(self.plugin_module)

    def driver_present(self) -> bool:
        """Whether the vendor's query tool is worth running here (its plugin or driver is
        present). Default: the plugin is installed."""
        return self.plugin_found()

    def query_driver(self, timeout: float) -> Tuple[Optional[str], Optional[str]]:
        """(driver version, None) from the query tool, or (None, problem); (None, None) when
        there is no tool or :meth:`driver_present` says there is nothing to ask it about."""
        return _probing.query_driver(self, timeout)

    def check_host(self, result: ProbeResult, driver_problem: Optional[str]) -> None:
        """Raise :class:`Unavailable` when the host plainly cannot run this chip."""

    def load_runtime(self, timeout: float) -> Any:
        """Import the vendor plugin (if any) and return the torch device module."""
        return _probing.load_runtime(self, timeout)

    def runtime_started(self) -> bool:
        """Whether this chip's runtime was already initialised in this process (its allocator has
        read its options): the device module is loaded and its ``is_initialized()`` says so."""
        import torch

        module = getattr(torch, self.device_type, None)
        started = getattr(module, "is_initialized", None)
        return bool(callable(started) and started())

    def runtime_version(self, module: Any) -> Optional[str]:
        """The version of the plugin (or torch's runtime) driving this chip."""
        if self.plugin_module:
            return getattr(sys.modules.get(self.plugin_module), "__version__", None)
        return None

    def list_devices(self, module: Any, timeout: float) -> List[DeviceInfo]:
        """The visible devices, through the device module; raises Unavailable for none."""
        return _probing.list_devices(module, self.device_type, timeout)

    # ----------------------------------------------------------------- answers
    def options(self, environ: Mapping[str, str] = os.environ) -> Mapping[str, Any]:
        """Chip-specific inputs read from the environment, validated once when a selection is
        made (and compared by ``Selection.same_request``); raises ConfigError. Default: none."""
        return MappingProxyType({})

    def profile_named(self, options: Mapping[str, Any]) -> Optional[str]:
        """The sim profile ``options`` (what :meth:`options` returned) select, which then serves
        them (``Registry.variant``); None (the default): this backend serves them."""
        return None

    def count_native_calls(self) -> Optional["NativeCalls"]:
        """Begin counting the chip's native operator calls when it can time them from the host
        (:class:`NativeCalls`); None (the default) when it cannot (a real chip runs its kernels
        asynchronously)."""
        return None

    def native_ops(self, options: Mapping[str, Any]) -> FrozenSet[str]:
        """ATen overloads the chip runs natively, once its runtime is loaded (the dispatcher's
        table for its dispatch key)."""
        from ..aten.dispatcher import native_set

        return native_set(self.dispatch_key)

    def torch_device(self, index: Optional[int] = None):
        """The ``torch.device`` of device ``index`` (None: the current one)."""
        import torch

        return torch.device(self.device_type, index) if index is not None else torch.device(self.device_type)

    def device_module(self) -> Any:
        """The device module ``torch.cuda`` is answered by (``torch.npu`` ...), once the backend
        is available."""
        import torch

        return getattr(torch, self.device_type)

    def cuda_capability(self, bfloat16: bool) -> Tuple[int, int]:
        """The compute capability ``torch.cuda`` reports for this chip (off NVIDIA): the lowest
        CUDA capability whose features the chip serves, so that code gated on it takes a path
        the chip runs — (8, 0), Ampere's, where the chip computes bfloat16 (torch itself decides
        bfloat16 support on CUDA from ``major >= 8``), else (7, 0), Volta's: float16 tensor
        cores, no bfloat16. Never (0, 0), which gates on every feature would read as a GPU
        older than any that runs torch."""
        return (8, 0) if bfloat16 else (7, 0)

    def cuda_environment(self) -> Tuple[_environment.Counterpart, ...]:
        """The chip's counterparts of the environment variables written for NVIDIA
        (``data/cuda_environment.json``: ``NCCL_SOCKET_IFNAME`` -> ``HCCL_SOCKET_IFNAME``...),
        applied at activation where the user has not set them."""
        return _environment.counterparts(self.name)

    def device_module_table(self):
        """The public names of the chip's device module as the vendor ships it
        (:class:`~.device_modules.DeviceModuleTable`, ``data/device_modules/<name>.json``), or
        None where no table is shipped."""
        from ..tables import device_modules

        return device_modules.load(self.name)

    # ----------------------------------------------------------------- memory
    def apply_memory_limit(self, selection: SelectionView) -> Optional[Callable[[], None]]:
        """Cap each selected device's pool at ``memory_virtual_limit`` (resolved against the
        device's memory); returns the undo. Default: the device module's
        ``set_per_process_memory_fraction(fraction, index)`` (torch.cuda, torch.xpu, torch_npu,
        torch_mlu, torch_musa). Raises :class:`~.memory.NotApplied` saying why it cannot."""
        limits, totals = {}, {}
        for logical, physical in enumerate(selection.devices):
            limits[physical] = selection.memory_limit_bytes(logical)
            totals[physical] = selection.device_memory(logical)
        if any(v is None for v in limits.values()):
            raise _memory.NotApplied("the device's total memory is unknown, so a fraction of it "
                                     "cannot be resolved")
        return _memory.fraction_limit(self.device_module(), f"torch.{self.device_type}",
                                      limits, totals)

    def memory_figures(self, index: int) -> _memory.PoolFigures:
        """Device ``index``'s pool figures (the device module's allocator statistics)."""
        return _memory.module_figures(self.device_module(), index)

    def release_cached_memory(self) -> None:
        """Give the pool's cached, unused blocks back (the device module's ``empty_cache``)."""
        release = _memory.real(self.device_module(), "empty_cache")
        if release is not None:
            release()

    def synchronize(self, index: int) -> None:
        """Wait for the work queued on device ``index``."""
        wait = _memory.real(self.device_module(), "synchronize")
        if wait is not None:
            wait(index)

    def dynamo_device_interface(self) -> Optional[type]:
        """Dynamo's ``DeviceInterface`` for this chip's device type where nothing else registers
        one (torch registers CUDA's, XPU's, MPS's; torch_npu its own); None: none needed."""
        return None

    def runtime_python_modules(self) -> Tuple[str, ...]:
        """The modules of Python code the chip's runtime runs from C++ (kernels, device guard,
        allocator): ``torch.compile`` must run their frames as they are, never trace them, as it
        cannot trace a chip's C++ kernels. Empty (the default): the runtime is C++."""
        return ()

    def runs_premul_sum_at_entry(self) -> bool:
        """Whether ``ReduceOp.PREMUL_SUM(factor)`` reductions of this chip's tensors run at
        ``torch.distributed``'s entry points as a multiply by the factor and a SUM, because the
        library that carries them lacks it where the chip's has it. False (the default): the
        chip's library takes them, or refuses them as the chip does."""
        return False

    def collective_staging(self) -> Optional[Mapping[str, int]]:
        """What this chip's collectives copied through host memory since the process started:
        ``{"collectives", "to_host_bytes", "to_device_bytes"}``; None where collectives run
        on the device itself (the default)."""
        return None

    # ----------------------------------------------------------------- use
    def start(self, selection: SelectionView) -> Optional[Any]:
        """What the chip's runtime needs before use (override); returns an undo or None. Called
        by :func:`.activation.activate` once the chip's variables are set and its plugin is
        imported."""
        return None

    def update_settings(self, old, new) -> None:
        """Apply a change of the assignable settings (``old`` -> ``new`` selection, same chip
        and devices) to the running chip itself in place; raise to refuse it, leaving ``old`` in
        force. Default: nothing (the memory and precision steps apply the settings)."""

    def plugin_version(self) -> Optional[str]:
        return self.runtime_version(None) if self.plugin_module else None

    def describe(self) -> dict:
        """The backend's static declaration, for reports."""
        return {
            "name": self.name, "vendor": self.vendor, "aliases": list(self.aliases),
            "device_type": self.device_type, "dispatch_key": self.dispatch_key,
            "collective": self.collective, "low_precision_dtype": self.low_precision_dtype,
            "supports_float64": self.supports_float64, "priority": self.priority,
            "auto_selectable": self.auto_selectable, "plugin": self.plugin_module,
            "visible_devices_env": self.visible_devices_env,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

