"""flagos_torchfl: run CUDA-written PyTorch code unchanged on whatever AI chip is present.

Importing is free: it initialises no device, imports no vendor plugin and patches nothing.
``ft.auto_select_backend()`` / ``ft.init_backend(...)`` activate; ``ft.deactivate()`` undoes.
"""
from __future__ import annotations

import sys
import types

from . import autoload as _autoload

if _autoload.started_as_command():
    _autoload.guard()  # before torch: a vendor plugin that cannot load must not take it down

import torch as _torch  # noqa: E402

from . import compat as _compat

from .version import __version__  # noqa: E402
try:
    _compat.check_torch(_torch.__version__)
except ImportError as _exc:
    if _compat.running_command_line(sys.argv):
        # `python -m flagos_torchfl ...` / `flagos-torchfl ...`: the sentence, no traceback
        sys.stderr.write(f"{_exc}\n")
        raise SystemExit(1) from None
    raise

from .api import (  # noqa: E402
    ASSIGNABLE as _ASSIGNABLE, CHOSEN_AT_INIT as _CHOSEN_AT_INIT, auto_select_backend, current_backend, deactivate, get_setting,
    init_backend, set_setting,
)
from .backends import get_backend, register_backend  # noqa: E402
from .errors import (  # noqa: E402
    ActivationError, AlreadyInitializedError, BackendUnavailableError, ConfigError, DeviceOrdinalError,
    CheckpointError, FlagOSError,
    OperatorNotSupportedError, PrivateUse1ClaimedError, UnknownBackendError, UnsupportedFeatureError,
)
from .routing import load_routing_config, routing_report  # noqa: E402
from .selection import Selection  # noqa: E402

__all__ = [
    "auto_select_backend", "init_backend", "current_backend", "deactivate", "get_backend",
    "register_backend", "Selection", "ActivationError", "AlreadyInitializedError", "CheckpointError",
    "BackendUnavailableError", "ConfigError", "DeviceOrdinalError", "FlagOSError", "OperatorNotSupportedError",
    "PrivateUse1ClaimedError", "UnknownBackendError", "UnsupportedFeatureError",
    "memory_virtual_limit", "memory_pool_clear_interval", "enable_mixed_precision",
    "routing_report", "load_routing_config", "save", "load", "checkpoint_info",
    "memory_stats", "memory_summary", "memory_pool_defrag",
    "set_op_precision", "check_finite", "precision_check",
]

#: public functions imported on first use (importing the package stays cheap): name -> module
#: (``module:name`` where the module calls it otherwise)
_LAZY = {
    "save": "checkpoint", "load": "checkpoint", "checkpoint_info": "checkpoint:info",
    "memory_stats": "memory", "memory_summary": "memory", "memory_pool_defrag": "memory",
    "set_op_precision": "precision.apply", "check_finite": "precision.apply",
    "precision_check": "precision.check",
}


def _misspelt_setting(package, name, value) -> bool:
    """True for a new public, non-module name close to an assignable setting's name."""
    from .errors import closest

    fresh = not name.startswith("_") and name not in package.__dict__
    return fresh and not isinstance(value, types.ModuleType) and bool(closest(name, _ASSIGNABLE))


class _Package(types.ModuleType):
    """Makes ``ft.memory_pool_clear_interval = 50`` (and the other settings) validated assignments."""

    def __setattr__(self, name, value):
        if name in _ASSIGNABLE or name in _CHOSEN_AT_INIT or _misspelt_setting(self, name, value):
            set_setting(name, value)  # a misspelt setting raises, naming the closest one
        else:
            super().__setattr__(name, value)

    def __getattr__(self, name):
        if name in _ASSIGNABLE:
            return get_setting(name)
        if name in _LAZY:
            import importlib

            module, _, attribute = _LAZY[name].partition(":")
            value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute or name)
            super().__setattr__(name, value)
            return value
        raise AttributeError(f"module 'flagos_torchfl' has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package
