"""Routing: every ATen operator the active backend lacks gets a route — a kernel library, a
composite (decomposition into operators the chip has), the CPU fallback — or a clear
:class:`~flagos_torchfl.errors.OperatorNotSupportedError`. Operators the chip has natively are
never intercepted.

Importing this package is cheap; the router is built when a backend activates (the api's
activation steps call :func:`activate` with the selection).
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Optional

_lock = threading.Lock()
_active = None
#: overrides loaded with :func:`load_routing_config`, and those the active selection read from
#: the environment (which win)
_loaded: Dict[str, tuple] = {}
_from_environment: Dict[str, tuple] = {}


def active_router():
    """The router of the active backend, or None."""
    return _active


def build_policy(chip, options, overrides):
    """The routing policy for a chip whose runtime is ready (its native kernels registered)."""
    from . import providers
    from .gaps import resolve_gaps
    from .router import Policy

    native = chip.native_ops(options)
    return Policy(
        backend=chip.name, dispatch_key=chip.dispatch_key, device_type=chip.device_type,
        native=native, dtype_gaps=resolve_gaps(chip.dtype_gaps, native),
        overrides={**_loaded, **overrides}, library=providers.library_for(chip),
        collective_staging=chip.collective_staging,
    )


def activate(selection) -> Optional[Callable[[], None]]:
    """Activation step: route the selected chip's missing operators; returns the undo (None
    when the chip runs every operator)."""
    global _active
    from ..log import get_logger

    chip = selection.chip
    if not chip.routes_operators:
        get_logger("routing").debug("%s runs every operator: nothing to route", chip.name)
        return None
    from .router import Router

    from_environment = selection.routing.override_table()
    router = Router(build_policy(chip, selection.options, from_environment))
    undo = router.install(selection.routing.registration)

    def deactivate() -> None:
        global _active
        with _lock:
            try:
                undo()
            finally:
                _active = None

    with _lock:
        _active = router
        _from_environment.clear()
        _from_environment.update(from_environment)
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
        environment = dict(_from_environment)
    if router is not None:
        router.reconfigure({**loaded, **environment})
    return {op: entry[0] for op, entry in loaded.items()}


def routing_report():
    """Per routed operator: route, calls, total time, host bytes copied — most expensive first."""
    from .report import routing_report as report

    return report()
