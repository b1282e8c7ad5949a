"""The probe procedure: how one backend is found to run here or not, from the steps its
:class:`~flagos_torchfl.backends.base.Backend` answers (the host check, the plugin and runtime, the devices, the
driver). Every step is bounded (:mod:`.bounded_calls`), and nothing raises: a failure is a reason."""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from typing import Any, List, Optional, Tuple

from .. import autoload
from ..log import get_logger
from . import pools as _memory
from . import bounded_calls as _calls
from . import visible as _visible

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
    status: str  # "available", "unavailable", "on-request" or "misconfigured"
    reason: Optional[str] = None
    devices: List[DeviceInfo] = dataclasses.field(default_factory=list)
    driver: Optional[str] = None
    runtime: Optional[str] = None
    native_ops: Optional[int] = None
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.status in ("available", "on-request")

    def raise_if_misconfigured(self) -> None:
        """Raise ConfigError when the probe found a bad setting (not a missing chip): an ordered
        list or automatic selection must not silently skip a backend that was asked for wrongly."""
        if self.status == "misconfigured":
            from ..errors import ConfigError

            raise ConfigError(f"backend {self.backend!r} is misconfigured: {self.reason}")

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


def run(chip: Any, timeout: Optional[float] = None, count_ops: bool = True, query_tools: bool = True,
        driver: Optional[Tuple[Optional[str], Optional[str]]] = None) -> ProbeResult:
    """Find whether ``chip`` can run here. Never raises and never hangs past ``timeout`` per
    step; every failure becomes ``reason``, and a misconfiguration (a ConfigError) becomes status
    ``"misconfigured"``. The vendor's query tool (which only adds the driver version) is run when
    ``query_tools`` is True, unless ``driver`` (a result of ``chip.query_driver`` obtained
    already) is given."""
    from ..errors import ConfigError

    timeout = _calls.probe_timeout() if timeout is None else timeout
    result = ProbeResult(backend=chip.name, status="unavailable")
    if driver is None and query_tools:
        driver = chip.query_driver(timeout)
    result.driver, driver_problem = driver or (None, None)
    if driver_problem:
        result.notes.append(driver_problem)
    try:
        chip.check_host(result, driver_problem)
        with _visible.translated(chip.visible_devices_env if chip.plugin_found() else None):
            module = chip.load_runtime(timeout)
            result.runtime = chip.runtime_version(module)
            result.devices = chip.list_devices(module, timeout)
    except Unavailable as exc:
        result.reason = exc.reason
        return result
    except ConfigError as exc:
        result.status, result.reason = "misconfigured", str(exc)
        return result
    result.status = "available"
    if count_ops:
        result.native_ops = len(chip.native_ops(chip.options()))
    return result


def plugin_found(module: Optional[str]) -> bool:
    """Whether the vendor plugin ``module`` is installed (found, not imported); True for none."""
    if not module:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def query_driver(chip: Any, timeout: float) -> Tuple[Optional[str], Optional[str]]:
    """(driver version, None) from ``chip``'s query tool, or (None, problem); (None, None) when
    it has no tool or ``chip.driver_present()`` says there is nothing to ask it about."""
    if not chip.query_tool or not chip.driver_present():
        return None, None
    out, problem = _calls.run_tool(list(chip.query_tool), timeout)
    if problem:
        return None, problem
    version = _calls.search_version(chip.driver_pattern, out)
    if version is None:
        return None, f"could not read a driver version from `{' '.join(chip.query_tool)}` output"
    return version, None


def load_runtime(chip: Any, timeout: float) -> Any:
    """Import ``chip``'s vendor plugin (if any), bounded by ``timeout``, and return its torch
    device module; raises :class:`Unavailable`. ``FL_EXPANDABLE_SEGMENTS=1`` is applied to the
    allocator variable the chip reads first (too late, with a warning, once its runtime ran)."""
    applied = _memory.add_allocator_option(chip.allocator_conf_env)
    if applied is not None and chip.runtime_started():
        log.warning("FL_EXPANDABLE_SEGMENTS=1 comes too late for this process: the %s allocator "
                    "started before activation and read its options then; %s=%s now reaches child "
                    "processes only. Start the program with `python -m flagos_torchfl run` or "
                    "activate before the device is first used", chip.name, *applied)
    elif applied is not None:
        log.info("FL_EXPANDABLE_SEGMENTS=1 applied as %s=%s", *applied)
    plugin = chip.plugin_module
    if plugin:
        if not chip.plugin_found():
            raise Unavailable(f"{plugin} is not installed")
        # a failure the start-up probe recorded means importing it here would fail again,
        # unless this process has imported it already (the program's own ``import torch_npu``)
        problem = None if plugin in sys.modules else autoload.plugin_problem(plugin)
        if problem:
            raise Unavailable(problem)
        _, problem = _calls.call_with_timeout(lambda: importlib.import_module(plugin), timeout,
                                              f"importing {plugin}")
        if problem:
            raise Unavailable(autoload.explain_import(plugin, problem))
    import torch

    module = getattr(torch, chip.device_type, None)
    if module is None:
        raise Unavailable(f"{plugin or 'torch'} provides no torch.{chip.device_type} module")
    return module


def list_devices(module: Any, device_type: str, timeout: float) -> List[DeviceInfo]:
    """The devices the device ``module`` sees (bounded by ``timeout``); raises
    :class:`Unavailable` for none."""

    def read():
        count = int(module.device_count())
        devices = []
        for i in range(count):
            props = module.get_device_properties(i)
            name = getattr(props, "name", None) or module.get_device_name(i)
            devices.append(DeviceInfo(i, str(name), getattr(props, "total_memory", None)))
        return devices

    devices, problem = _calls.call_with_timeout(read, timeout, f"querying torch.{device_type} devices")
    if problem:
        raise Unavailable(problem)
    if not devices:
        raise Unavailable("0 devices visible")
    return devices
