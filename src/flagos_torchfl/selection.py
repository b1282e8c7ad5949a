"""Turns what the user asked for — ``run --backend``, ``FL_BACKEND``, ``init_backend(...)`` in
code, or nothing — into one validated :class:`Selection`.

Precedence, so that switching chips never needs a code change: the launcher's ``--backend`` (it
sets ``FL_BACKEND`` for the program) > ``FL_BACKEND`` > ``init_backend(backend=...)`` > automatic.
Pure decisions: nothing here activates anything.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import config, variables
from .backends import Backend, ProbeResult, registry
from .errors import BackendUnavailableError, ConfigError, UnknownBackendError
from .log import get_logger
from .precision.op_precision import fp32_ops_from_env
from .routing.config import RoutingConfig, routing_config

log = get_logger("selection")

Probe = Callable[[str], ProbeResult]


@dataclasses.dataclass(frozen=True)
class Selection:
    """The active backend choice: everything activation needs, read and validated once.
    Logical device ``i`` (``cuda:i`` in user code) is ``devices[i]`` of ``chip``."""

    backend: str
    chip: Backend
    devices: Tuple[int, ...]
    settings: config.Settings
    source: str  # "launcher", "FL_BACKEND", "argument" or "auto"
    reason: str
    #: chip-specific inputs (``Backend.options``), e.g. sim's native operator set
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: routing inputs: the operator overrides and how routes are registered
    routing: Optional[RoutingConfig] = None
    #: packages that are told the truth by ``torch.cuda.is_available()`` (``FL_CUDA_KERNEL_PACKAGES``)
    cuda_kernel_packages: Tuple[str, ...] = ()
    #: operators that run in float32 under autocast (``FL_FP32_OPS``)
    fp32_ops: Tuple[str, ...] = ()
    #: whether the finite guard is on (``FL_CHECK_FINITE``)
    check_finite: bool = False
    probe: Optional[ProbeResult] = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def device_type(self) -> str:
        return self.chip.device_type

    @property
    def dispatch_key(self) -> str:
        return self.chip.dispatch_key

    @property
    def collective(self) -> str:
        return self.chip.collective

    @property
    def low_precision_dtype(self) -> str:
        return self.chip.low_precision_dtype

    def same_request(self, other: "Selection") -> bool:
        """True when ``other`` asks for exactly this backend, these devices, these settings and
        these chip and routing inputs."""
        def key(s: "Selection"):
            return (s.backend, s.devices, s.settings, dict(s.options), s.routing, s.cuda_kernel_packages,
                    s.fp32_ops, s.check_finite)

        return key(self) == key(other)

    def device_memory(self, logical: int) -> Optional[int]:
        """Total memory of logical device ``logical`` as the probe saw it (None if unknown)."""
        if self.probe is None:
            return None
        physical = self.devices[logical]
        for info in self.probe.devices:
            if info.index == physical:
                return info.total_memory
        return None

    def memory_limit_bytes(self, logical: int = 0) -> Optional[int]:
        """``memory_virtual_limit`` resolved to bytes for one logical device (None: no limit)."""
        limit = self.settings.memory_virtual_limit
        return None if limit is None else limit.resolve(self.device_memory(logical))

    def as_dict(self) -> dict:
        limit = self.settings.memory_virtual_limit
        return {
            "backend": self.backend, "device_type": self.device_type,
            "dispatch_key": self.dispatch_key, "devices": list(self.devices),
            "source": self.source, "reason": self.reason, "collective": self.collective,
            "low_precision_dtype": self.low_precision_dtype,
            "memory_virtual_limit": None if limit is None else str(limit),
            "memory_pool_clear_interval": self.settings.memory_pool_clear_interval,
            "enable_mixed_precision": self.settings.enable_mixed_precision,
        }


def parse_backend_list(value: Union[str, Sequence[str]], source: str) -> List[str]:
    """``"ascend,cuda,cpu"`` or a list of names -> canonical names, in order; unknown names and
    anything but a string or a list/tuple of strings are ConfigErrors."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        items = list(value)
    else:
        raise ConfigError(f"{source}={value!r} is not valid: give a backend name such as 'cpu', a "
                          f"comma-separated string or a list of names; valid names: "
                          f"{', '.join(registry().valid_names())}")
    names = [item.strip() for item in items if item.strip()]
    if not names:
        raise ConfigError(f"{source} is empty; valid names: {', '.join(registry().valid_names())}")
    canonical = []
    for name in names:
        try:
            canonical.append(registry().canonical(name))
        except UnknownBackendError as exc:
            raise UnknownBackendError(name, exc.valid, source=f"{source} value") from None
    return list(dict.fromkeys(canonical))


def default_probe(name: str) -> ProbeResult:
    return registry().get(name).probe(count_ops=False, query_tools=False)


def choose(
    requested: Optional[Union[str, Sequence[str]]] = None,
    environ: Mapping[str, str] = os.environ,
    probe: Probe = default_probe,
) -> Tuple[str, str, str, ProbeResult]:
    """(backend name, source, why, probe result) for a request; raises when it cannot be met."""
    env_value = variables.read("FL_BACKEND", environ)
    if env_value:
        source = "launcher" if variables.read("FL_BACKEND_FROM_LAUNCHER", environ) else "FL_BACKEND"
        label = "run --backend" if source == "launcher" else "FL_BACKEND"
        candidates = parse_backend_list(env_value, label)
        if requested is not None:
            in_code = parse_backend_list(requested, "backend")
            if in_code != candidates:
                log.info("%s=%s overrides init_backend(backend=%r) in code", label, env_value, requested)
        return _first_available(candidates, probe, source, f"{label}={env_value}")
    if requested is not None:
        candidates = parse_backend_list(requested, "backend")
        return _first_available(candidates, probe, "argument", f"backend={requested!r} in code")
    return _auto(probe)


def _first_available(names: List[str], probe: Probe, source: str, origin: str):
    reasons: Dict[str, str] = {}
    for position, name in enumerate(names):
        result = probe(name)
        result.raise_if_misconfigured()
        if result.available:
            why = f"requested by {origin}"
            if position:
                why = f"first available in {origin}"
            return name, source, why, result
        reasons[name] = result.reason or "unavailable"
    if len(names) == 1:
        raise BackendUnavailableError(names[0], reasons[names[0]])
    detail = "; ".join(f"{n}: {r}" for n, r in reasons.items())
    raise BackendUnavailableError(",".join(names), f"none of them is available ({detail})")


def _auto(probe: Probe):
    """The highest-priority available backend; one warning names each backend skipped although
    its vendor plugin is installed (a broken installation, not a missing chip), and why."""
    skipped, reasons, installed = [], [], []
    for backend in registry().backends():
        if not backend.auto_selectable:
            continue
        result = probe(backend.name)
        result.raise_if_misconfigured()
        if result.available:
            why = "highest-priority available backend"
            if skipped:
                why += f"; not available: {', '.join(skipped)}"
            if installed:
                log.warning("running on %s: %s", backend.name, "; ".join(installed))
            return backend.name, "auto", why, result
        skipped.append(backend.name)
        reasons.append(f"{backend.name}: {result.reason}")
        if backend.plugin_module and backend.plugin_found():
            installed.append(f"{backend.name} skipped, its plugin is installed but {result.reason}")
    raise BackendUnavailableError("auto", "no backend is available: " + "; ".join(reasons))


def merge_settings(code: Mapping[str, object], environ: Mapping[str, str] = os.environ) -> config.Settings:
    """Code settings overlaid by ``FL_*`` environment settings (the environment wins, logged)."""
    from_env = variables.settings_from_env(environ)
    for name in from_env:
        given = code.get(name)
        if given is not None and given is not False:
            log.info("%s=%s overrides %s=%r in code", variables.SETTING_VARIABLES[name],
                     variables.raw(variables.SETTING_VARIABLES[name], environ), name, given)
    merged = {**{k: v for k, v in code.items() if v is not None}, **from_env}
    return config.settings_from(merged)


def build_selection(
    backend: Optional[Union[str, Sequence[str]]] = None,
    settings: Optional[Mapping[str, object]] = None,
    environ: Mapping[str, str] = os.environ,
    probe: Probe = default_probe,
) -> Selection:
    """Validate every input (settings, routing and the chosen chip's own) and decide; raises
    before anything is activated if any input is bad."""
    variables.validate(environ)
    merged = merge_settings(settings or {}, environ)
    routing = routing_config(environ)
    name, source, why, result = choose(backend, environ, probe)
    return assemble(name, source, why, result, merged, routing, environ)


def assemble(name: str, source: str, why: str, result: ProbeResult, merged: config.Settings,
             routing: RoutingConfig, environ: Mapping[str, str] = os.environ) -> Selection:
    """The Selection of backend ``name`` as probed (``result``) with validated settings: takes the
    chip's variant its options ask for (a sim profile), ranges ``gpu_ids`` and checks the memory
    limit against the devices' memory."""
    family = registry().get(name)
    options = family.options(environ)
    chip = registry().variant(family, options)
    if chip is not family:  # a variant (a sim profile) answers for its own devices
        result = chip.probe(count_ops=False)
        if not result.available:
            raise BackendUnavailableError(chip.name, result.reason or "unavailable")
    count = result.device_count
    devices = config.parse_gpu_ids(merged.gpu_ids, count) if merged.gpu_ids else _first_devices(count, environ)
    selection = Selection(
        backend=name, chip=chip, devices=devices, settings=dataclasses.replace(merged, gpu_ids=devices),
        source=source, reason=why, options=options, routing=routing,
        cuda_kernel_packages=variables.read("FL_CUDA_KERNEL_PACKAGES", environ),
        fp32_ops=fp32_ops_from_env(environ), check_finite=variables.read("FL_CHECK_FINITE", environ),
        probe=result,
    )
    check_memory_limit(selection)
    return selection


def check_memory_limit(selection: Selection) -> None:
    """ConfigError when ``memory_virtual_limit`` resolves, on a device whose memory is known, to
    less than 1 MiB or to more than the device has."""
    limit = selection.settings.memory_virtual_limit
    if limit is None:
        return
    for logical in range(len(selection.devices)):
        total, resolved = selection.device_memory(logical), selection.memory_limit_bytes(logical)
        if total is None or resolved is None:
            continue
        if resolved < config.MIB:
            raise ConfigError(f"memory_virtual_limit={limit} is {resolved} bytes on device {logical}, below "
                              f"the minimum of 1 MiB; give a larger limit")
        if resolved > total:
            raise ConfigError(f"memory_virtual_limit={limit} is more than device {logical} of backend "
                              f"{selection.backend!r} has ({config.format_bytes(total)}); give at most that, "
                              "or a fraction such as '90%'")


def _first_devices(count: int, environ: Mapping[str, str]) -> Tuple[int, ...]:
    """Every device, or the first ``FL_DEVICES`` of them (ConfigError when there are fewer)."""
    wanted = variables.read("FL_DEVICES", environ)
    if wanted is None:
        return tuple(range(count))
    if wanted > count:
        raise ConfigError(f"FL_DEVICES={wanted} asks for more devices than the backend has ({count})")
    return tuple(range(wanted))


def would_pick(environ: Mapping[str, str] = os.environ, probe: Probe = default_probe) -> Tuple[Optional[str], str]:
    """What ``auto_select_backend()`` would pick here, and why (or None and the error)."""
    try:
        name, _source, why, _ = choose(None, environ, probe)
        return name, why
    except Exception as exc:  # detect reports it instead of failing
        return None, str(exc)
