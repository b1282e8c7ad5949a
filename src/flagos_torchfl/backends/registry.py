"""The registry of chip families: the built-in ones plus those installed by third parties
through the entry-point group ``flagos_torchfl.backends`` (an entry point names a Backend
subclass or instance)."""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Mapping, Union

from ..errors import ConfigError, UnknownBackendError
from .ascend import AscendBackend
from .base import Backend
from ..tables import chip_models
from .cambricon import CambriconBackend
from .cpu import CpuBackend
from .cuda import CudaBackend
from .mps import MpsBackend
from .mthreads import MThreadsBackend
from .profile import ProfileBackend
from ..tables.profile_specs import check_profile
from .rocm import RocmBackend
from .sim import SimBackend
from .xpu import XpuBackend

ENTRY_POINT_GROUP = "flagos_torchfl.backends"
BUILTIN = (
    CudaBackend, RocmBackend, AscendBackend, CambriconBackend, MThreadsBackend,
    XpuBackend, MpsBackend, CpuBackend, SimBackend,
)


class Registry:
    """Backends by name and alias, highest auto-select priority first."""

    def __init__(self, load_entry_points: bool = True):
        self._backends: Dict[str, Backend] = {}
        self._aliases: Dict[str, str] = {}
        #: entry points that failed to load: name -> reason
        self.load_errors: Dict[str, str] = {}
        self._entry_points_pending = load_entry_points
        self._profiles: Dict[str, ProfileBackend] = {}
        self._lock = threading.RLock()
        for cls in BUILTIN:
            self.register(cls())

    def register(self, backend: Union[Backend, type]) -> Backend:
        """Add a backend; its name and aliases must not collide with a registered one."""
        if isinstance(backend, type):
            backend = backend()
        if not isinstance(backend, Backend):
            raise ConfigError(f"{backend!r} is not a flagos_torchfl Backend")
        if not backend.name or not backend.device_type:
            raise ConfigError(f"backend {type(backend).__name__} must set name and device_type")
        with self._lock:
            taken = {*self._backends, *self._aliases}
            clash = [n for n in (backend.name, *backend.aliases) if n in taken]
            if clash:
                raise ConfigError(f"backend name or alias {clash[0]!r} is already registered")
            self._backends[backend.name] = backend
            for alias in backend.aliases:
                self._aliases[alias] = backend.name
        return backend

    def profile(self, name: str) -> ProfileBackend:
        """The sim profile ``name`` names: the sim answering as the registered chip ``name``
        (its default model) or ``chip:model``; one instance per name. ConfigError for a name
        that is no profile (the closest and the valid ones named)."""
        spec = check_profile(name)
        with self._lock:
            found = self._profiles.get(spec)
            if found is None:
                chip, _, model = spec.partition(":")
                model_found = chip_models.model(chip, model) if model else chip_models.default_model(chip)
                found = self._profiles[spec] = ProfileBackend(self.get(chip), model_found)
            return found

    def variant(self, family: Backend, options: Mapping[str, Any]) -> Backend:
        """The backend serving ``family``'s ``options`` (what its ``options()`` returned): the
        profile they name (``Backend.profile_named``: the sim's ``FL_SIM_PROFILE``), else
        ``family`` itself."""
        name = family.profile_named(options)
        return self.profile(name) if name else family

    def _load_entry_points(self) -> None:
        with self._lock:
            if not self._entry_points_pending:
                return
            self._entry_points_pending = False
            from ..entry_points import load_entry_points

            self.load_errors.update(load_entry_points(ENTRY_POINT_GROUP, self.register))

    def backends(self) -> List[Backend]:
        """Every backend, highest priority first."""
        self._load_entry_points()
        return sorted(self._backends.values(), key=lambda b: (-b.priority, b.name))

    def valid_names(self) -> List[str]:
        self._load_entry_points()
        return sorted({*self._backends, *self._aliases})

    def canonical(self, name: str) -> str:
        """The backend name ``name`` (a name or alias, any case) stands for."""
        self._load_entry_points()
        key = str(name).strip().lower()
        if key in self._backends:
            return key
        if key in self._aliases:
            return self._aliases[key]
        raise UnknownBackendError(name, self.valid_names())

    def get(self, name: str) -> Backend:
        return self._backends[self.canonical(name)]


_registry: Registry | None = None
_registry_lock = threading.Lock()


def registry() -> Registry:
    """The process-wide registry (built on first use)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = Registry()
        return _registry


def get_backend(name: str) -> Backend:
    return registry().get(name)


def register_backend(backend: Union[Backend, type]) -> Backend:
    """Register a backend from code (third-party packages use the entry-point group instead)."""
    return registry().register(backend)
