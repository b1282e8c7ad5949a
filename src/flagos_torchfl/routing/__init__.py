"""Routing: every ATen operator the active backend lacks gets a route — a kernel library, a
composite (decomposition into operators the chip has), the CPU fallback — or a clear
:class:`~flagos_torchfl.errors.OperatorNotSupportedError`. Operators the chip has natively are
never intercepted.

Importing this package is cheap; the router is built when a backend activates (the api's
activation steps call :func:`activate` with the selection).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

from .state import active_router, current_verdict, lock as _lock, set_active

#: overrides loaded with :func:`load_routing_config`, and those the active selection read from
#: the environment (which win)
_loaded: Dict[str, tuple] = {}
_from_environment: Dict[str, tuple] = {}


def build_policy(chip, options, overrides):
    """The routing policy for a chip whose runtime is ready (its native kernels registered)."""
    from . import providers
    from .gaps import resolve_gaps
    from .router import Policy

    native = chip.native_ops(options)
    return Policy(
        chip_name=chip.name, dispatch_key=chip.dispatch_key, device_type=chip.device_type,
        native=native, dtype_gaps=resolve_gaps(chip.dtype_gaps, native),
        overrides={**_loaded, **overrides}, library=providers.library_for(chip),
        collective_staging=chip.collective_staging,
    )


def activate(selection) -> Optional[Callable[[], None]]:
    """Activation step: route the selected chip's missing operators; returns the undo (None
    when the chip runs every operator). A census counts the run for the verdict, and
    ``FL_FALLBACK_BUDGET`` holds it to a budget."""
    from ..log import get_logger

    chip = selection.chip
    if not chip.routes_operators:
        get_logger("routing").debug("%s runs every operator: nothing to route", chip.name)
        return None
    from .router import Router

    from_environment = selection.routing.override_table()
    router = Router(build_policy(chip, selection.options, from_environment))
    undo = router.install(selection.routing.registration)
    census, stop_watching = _watch(router, chip, selection.routing.budget)

    def deactivate() -> None:
        with _lock:
            try:
                stop_watching()
                undo()
            finally:
                set_active(None, None)

    with _lock:
        set_active(router, census)
        _from_environment.clear()
        _from_environment.update(from_environment)
    return deactivate


def _watch(router, chip, budget):
    """Start the census of ``router`` and hold it to ``budget`` (None: no budget); returns the
    census and the undo."""
    import atexit

    from .budget import Guard
    from .verdict import Census, verdict

    census = Census(router, chip)
    stop = census.start()
    if budget is None:
        return census, stop
    guard = Guard(budget, lambda: verdict(router, census))
    router.watch = guard.after_call
    census.on_step = guard.after_step
    atexit.register(guard.at_exit)

    def undo() -> None:
        atexit.unregister(guard.at_exit)
        router.watch = census.on_step = None
        stop()

    return census, undo


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
        router = active_router()
        environment = dict(_from_environment)
    if router is not None:
        router.reconfigure({**loaded, **environment})
    return {op: entry[0] for op, entry in loaded.items()}


def routing_report():
    """Per routed operator: route, calls, total time, host bytes copied — most expensive first."""
    from .report import routing_report as report

    return report()
