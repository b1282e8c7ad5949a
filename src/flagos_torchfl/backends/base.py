"""The shape every chip family fills in: what it is, how to probe it, and every answer that
differs from one chip to another.

The layers above ask a :class:`Backend`; they never test a backend's name. A backend module
knows nothing of patches or routing: it answers questions about one kind of chip.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from types import MappingProxyType
from typing import Any, FrozenSet, List, Mapping, Optional, Tuple

from ..log import get_logger
from . import probe as _probe

log = get_logger("backends")


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    total_memory: Optional[int] = None


@dataclasses.dataclass
class ProbeResult:
    """What probing one backend found. ``reason`` says in plain words why it is unavailable."""

    backend: str
    status: str  # "available", "unavailable" or "on-request"
    reason: Optional[str] = None
    devices: List[DeviceInfo] = dataclasses.field(default_factory=list)
    driver: Optional[str] = None
    runtime: Optional[str] = None
    native_ops: Optional[int] = None
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.status in ("available", "on-request")

    @property
    def device_count(self) -> int:
        return len(self.devices)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Unavailable(Exception):
    """Raised inside a probe step to end the probe with ``reason``."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


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
    #: operators the chip has natively but not for some dtypes: dtype name -> operator names
    #: (semantic names, categories or ATen names; "*": every native operator), e.g.
    #: ``{"float64": ("matmul", "aten::cumsum")}``. Routing gives them a route for those dtypes.
    dtype_gaps: Mapping[str, Tuple[str, ...]] = MappingProxyType({})
    #: whether activation enforces ``memory_virtual_limit`` on this backend
    enforces_memory_limit: bool = False
    #: whether pinned host memory means anything here (False: ``pin_memory()`` is a no-op)
    pins_memory: bool = True
    #: whether process groups and DDP are bound to one device (False: ``device_id`` / DDP
    #: ``device_ids`` are dropped, as for CPU modules)
    binds_process_group_device: bool = True
    #: whether operators can be missing here (False: the chip runs every ATen operator)
    routes_operators: bool = True
    #: kernel libraries (provider names, e.g. ``"flaggems"``) that may serve this chip
    kernel_libraries: Tuple[str, ...] = ()

    # ----------------------------------------------------------------- probing
    def probe(self, timeout: Optional[float] = None, count_ops: bool = True) -> ProbeResult:
        """Find whether this backend can run here. Never raises and never hangs past ``timeout``
        per step; every failure becomes ``reason``."""
        timeout = _probe.probe_timeout() if timeout is None else timeout
        result = ProbeResult(backend=self.name, status="unavailable")
        result.driver, driver_problem = self.query_driver(timeout)
        if driver_problem:
            result.notes.append(driver_problem)
        try:
            self.check_host(result, driver_problem)
            module = self.load_runtime(timeout)
            result.runtime = self.runtime_version(module)
            result.devices = self.list_devices(module, timeout)
        except Unavailable as exc:
            result.reason = exc.reason
            return result
        result.status = "available"
        if count_ops:
            result.native_ops = len(self.native_ops(self.options()))
        return result

    def query_driver(self, timeout: float) -> Tuple[Optional[str], Optional[str]]:
        """(driver version, None) from the query tool, or (None, problem)."""
        if not self.query_tool:
            return None, None
        out, problem = _probe.run_tool(list(self.query_tool), timeout)
        if problem:
            return None, problem
        version = _probe.search_version(self.driver_pattern, out)
        if version is None:
            return None, f"could not read a driver version from `{' '.join(self.query_tool)}` output"
        return version, None

    def check_host(self, result: ProbeResult, driver_problem: Optional[str]) -> None:
        """Raise :class:`Unavailable` when the host plainly cannot run this chip."""

    def load_runtime(self, timeout: float) -> Any:
        """Import the vendor plugin (if any) and return the torch device module."""
        translate_visible_devices(self.visible_devices_env)
        if self.plugin_module:
            if importlib.util.find_spec(self.plugin_module) is None:
                raise Unavailable(f"{self.plugin_module} is not installed")
            _, problem = _probe.call_with_timeout(
                lambda: importlib.import_module(self.plugin_module), timeout,
                f"importing {self.plugin_module}",
            )
            if problem:
                raise Unavailable(problem)
        import torch

        module = getattr(torch, self.device_type, None)
        if module is None:
            source = self.plugin_module or "torch"
            raise Unavailable(f"{source} provides no torch.{self.device_type} module")
        return module

    def runtime_version(self, module: Any) -> Optional[str]:
        """The version of the plugin (or torch's runtime) driving this chip."""
        if self.plugin_module:
            import sys

            return getattr(sys.modules.get(self.plugin_module), "__version__", None)
        return None

    def list_devices(self, module: Any, timeout: float) -> List[DeviceInfo]:
        """The visible devices, through the device module; raises Unavailable for none."""

        def read():
            count = int(module.device_count())
            devices = []
            for i in range(count):
                props = module.get_device_properties(i)
                name = getattr(props, "name", None) or module.get_device_name(i)
                devices.append(DeviceInfo(i, str(name), getattr(props, "total_memory", None)))
            return devices

        devices, problem = _probe.call_with_timeout(
            read, timeout, f"querying torch.{self.device_type} devices"
        )
        if problem:
            raise Unavailable(problem)
        if not devices:
            raise Unavailable("0 devices visible")
        return devices

    # ----------------------------------------------------------------- answers
    def options(self, environ: Mapping[str, str] = os.environ) -> Mapping[str, Any]:
        """Chip-specific inputs read from the environment, validated once when a selection is
        made (and compared by ``Selection.same_request``); raises ConfigError. Default: none."""
        return MappingProxyType({})

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

    def collective_staging(self) -> Optional[Mapping[str, int]]:
        """What this chip's collectives copied through host memory since the process started:
        ``{"collectives", "to_host_bytes", "to_device_bytes"}``; None where collectives run
        on the device itself (the default)."""
        return None

    # ----------------------------------------------------------------- use
    def activate(self, selection) -> Optional[Any]:
        """Prepare the runtime for ``selection``; return an undo callable or None. Warns about
        given settings the backend does not apply, and once when the vendor plugin's version is
        outside the tested ones."""
        unapplied = self.unapplied_settings(selection.settings)
        if unapplied:
            log.warning("accepted but not applied on backend %s in this version: %s",
                        self.name, ", ".join(unapplied))
        if self.plugin_module:
            from ..compat import check_plugin

            check_plugin(self.plugin_module, self.plugin_version(), self.tested_plugin_versions)
        return self.start(selection)

    def start(self, selection) -> Optional[Any]:
        """What the chip's runtime needs before use (override); returns an undo or None."""
        return None

    def unapplied_settings(self, settings) -> List[str]:
        """The settings given in ``settings`` that this backend does not act on yet."""
        names = []
        if settings.memory_virtual_limit is not None and not self.enforces_memory_limit:
            names.append(f"memory_virtual_limit={settings.memory_virtual_limit}")
        if settings.memory_pool_clear_interval is not None:
            names.append(f"memory_pool_clear_interval={settings.memory_pool_clear_interval}")
        if settings.enable_mixed_precision:
            names.append("enable_mixed_precision=True")
        return names

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


def translate_visible_devices(variable: Optional[str], environ=os.environ) -> None:
    """Copy ``CUDA_VISIBLE_DEVICES`` to the vendor's variable (e.g. ``ASCEND_RT_VISIBLE_DEVICES``)
    before its runtime starts, unless the vendor's variable is set already."""
    cuda_mask = environ.get("CUDA_VISIBLE_DEVICES")
    if variable and cuda_mask is not None and variable not in environ:
        environ[variable] = cuda_mask
        from ..log import get_logger

        get_logger("backends").info("CUDA_VISIBLE_DEVICES=%s applied as %s", cuda_mask, variable)
