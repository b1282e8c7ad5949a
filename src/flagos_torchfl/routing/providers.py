"""Kernel libraries ("providers"): the first route for an operator the chip lacks.

A provider declares, for a backend, which operators it implements and for which dtypes and
modes. Providers come from :func:`register_provider` (code) or the entry-point group
``flagos_torchfl.kernel_providers`` (an entry point names a :class:`KernelProvider` subclass or
instance). FlagGems plugs in by itself when ``flag_gems`` is installed on a chip it supports.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import threading
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional

import torch

from ..errors import ConfigError
from ..log import get_logger

log = get_logger("routing")
ENTRY_POINT_GROUP = "flagos_torchfl.kernel_providers"


@dataclasses.dataclass(frozen=True)
class ProviderKernel:
    """One operator a provider implements. ``fn`` takes the operator's arguments as the
    dispatcher passes them (kwarg-only ones by name). ``dtypes``: the dtypes it handles (None:
    all). ``autograd``: whether it may serve calls whose inputs require grad."""

    op: str
    fn: Callable[..., Any]
    dtypes: Optional[FrozenSet[torch.dtype]] = None
    autograd: bool = True

    def serves(self, dtypes: Iterable[torch.dtype], training: bool) -> bool:
        if training and not self.autograd:
            return False
        return self.dtypes is None or all(d in self.dtypes for d in dtypes)


class KernelProvider:
    """Base class of kernel libraries. Subclasses set ``name`` and ``priority`` (higher is tried
    first) and override :meth:`supports` and :meth:`kernels`."""

    name: str = ""
    priority: int = 0

    def supports(self, backend) -> bool:
        """Whether the provider can serve ``backend`` (a :class:`~flagos_torchfl.backends.Backend`)."""
        return False

    def kernels(self, backend) -> Iterable[ProviderKernel]:
        """The kernels it offers on ``backend``; called once when routing activates."""
        return ()


class FlagGemsProvider(KernelProvider):
    """FlagGems' Triton kernels (``flag_gems._FULL_CONFIG``), on the chips FlagGems runs on."""

    name = "flaggems"
    priority = 100

    def supports(self, backend) -> bool:
        """On the chips that list ``"flaggems"`` among their kernel libraries, when installed."""
        return self.name in backend.kernel_libraries and importlib.util.find_spec("flag_gems") is not None

    def kernels(self, backend) -> Iterable[ProviderKernel]:
        gems = importlib.import_module("flag_gems")
        if getattr(gems, "device", backend.device_type) != backend.device_type:
            log.info("flag_gems runs on %r, not on %r: not used", gems.device, backend.device_type)
            return []
        found = []
        for entry in getattr(gems, "_FULL_CONFIG", ()):
            name, fn = entry[0], entry[1]
            condition = entry[2] if len(entry) > 2 else None
            keys = entry[3] if len(entry) > 3 else None
            if keys or (condition is not None and not condition()):
                continue
            found.append(ProviderKernel(op="aten::" + name.replace(".default", ""), fn=fn))
        return found


_lock = threading.Lock()
_registered: List[KernelProvider] = []
_entry_points_loaded = False
#: entry points that failed to load: name -> reason
load_errors: Dict[str, str] = {}


def register_provider(provider: Any) -> KernelProvider:
    """Add a provider (a KernelProvider subclass or instance); returns the instance."""
    if isinstance(provider, type):
        provider = provider()
    if not isinstance(provider, KernelProvider) or not provider.name:
        raise ConfigError(f"{provider!r} is not a KernelProvider with a name")
    with _lock:
        if any(p.name == provider.name for p in _registered):
            raise ConfigError(f"a kernel provider named {provider.name!r} is already registered")
        _registered.append(provider)
    return provider


def unregister_provider(name: str) -> None:
    """Remove the provider called ``name`` (no error when there is none)."""
    with _lock:
        _registered[:] = [p for p in _registered if p.name != name]


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from ..entry_points import load_entry_points

    load_errors.update(load_entry_points(ENTRY_POINT_GROUP, register_provider))


def providers() -> List[KernelProvider]:
    """Every registered provider (FlagGems included), highest priority first."""
    _load_entry_points()
    with _lock:
        found = list(_registered)
    if not any(p.name == FlagGemsProvider.name for p in found):
        found.append(FlagGemsProvider())
    return sorted(found, key=lambda p: -p.priority)


def library_for(backend) -> Dict[str, List[tuple]]:
    """Operator name -> [(provider name, kernel), ...] (best first) for ``backend``. A provider
    whose declaration fails is left out and logged."""
    table: Dict[str, List[tuple]] = {}
    for provider in providers():
        try:
            if not provider.supports(backend):
                continue
            kernels = list(provider.kernels(backend))
        except Exception as exc:
            log.warning("kernel provider %s left out: %s: %s", provider.name, type(exc).__name__, exc)
            continue
        for kernel in kernels:
            table.setdefault(kernel.op, []).append((provider.name, kernel))
    return table
