"""Routing: every ATen operator the active backend lacks gets a route — a kernel library, a
composite (decomposition into operators the chip has), the CPU fallback — or a clear
:class:`~flagos_torchfl.errors.OperatorNotSupportedError`. Operators the chip has natively are
never intercepted.

Importing this package is cheap; the router is built when a backend activates
(``ACTIVATION_STEPS`` in ``api.py`` calls :func:`activate`).
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Dict, Optional

ENV_REGISTRATION = "FL_ROUTING_REGISTRATION"
REGISTRATIONS = ("auto", "per-op")

_lock = threading.Lock()
_active = None
_loaded: Dict[str, tuple] = {}


def active_router():
    """The router of the active backend, or None."""
    return _active


def build_policy(backend, environ=os.environ):
    """The routing policy for a backend whose runtime is ready (its native kernels registered)."""
    from . import coverage, overrides, providers
    from .gaps import resolve_gaps
    from .router import Policy

    native = coverage.native_set(backend.dispatch_key)
    return Policy(
        backend=backend.name, dispatch_key=backend.dispatch_key, device_type=backend.device_type,
        native=native, dtype_gaps=resolve_gaps(backend.dtype_gaps, native),
        overrides={**_loaded, **overrides.from_env(environ)},
        library=providers.library_for(backend),
    )


def registration_mode(environ=os.environ) -> str:
    """``FL_ROUTING_REGISTRATION``: ``auto`` (a backend fallback where possible) or ``per-op``."""
    from ..errors import ConfigError, suggestion

    value = environ.get(ENV_REGISTRATION, "auto").strip().lower() or "auto"
    if value not in REGISTRATIONS:
        raise ConfigError(f"{ENV_REGISTRATION}={value!r} is not valid.{suggestion(value, REGISTRATIONS)} "
                          f"Valid: {', '.join(REGISTRATIONS)}")
    return value


def activate(selection) -> Optional[Callable[[], None]]:
    """Activation step: route the selected backend's missing operators; returns the undo."""
    global _active
    from ..backends import get_backend
    from ..log import get_logger

    backend = get_backend(selection.backend)
    if backend.dispatch_key == "CPU":
        get_logger("routing").debug("the CPU runs every operator: nothing to route")
        return None
    from .router import Router

    mode = registration_mode()
    router = Router(build_policy(backend))
    undo = router.install(mode)

    def deactivate() -> None:
        global _active
        with _lock:
            try:
                undo()
            finally:
                _active = None

    with _lock:
        _active = router
    return deactivate


def load_routing_config(path) -> Dict[str, str]:
    """Load per-operator route overrides from a JSON or TOML file (``{"routes": {"softmax":
    "cpu", "gelu": "composite"}}``) and apply them now if a backend is active, else at the next
    activation. ``FL_OP_ROUTE`` still wins. Returns overload -> route; raises ConfigError for
    an unknown name (with the closest matches) or route."""
    from . import overrides

    loaded = overrides.load_file(path)
    with _lock:
        _loaded.clear()
        _loaded.update(loaded)
        router = _active
    if router is not None:
        router.reconfigure({**loaded, **overrides.from_env()})
    return {op: entry[0] for op, entry in loaded.items()}


def routing_report():
    """Per routed operator: route, calls, total time, host bytes copied — most expensive first."""
    from .report import routing_report as report

    return report()
