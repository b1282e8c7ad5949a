"""The functions users call. Selection decides; activation applies the decision through an
ordered list of steps (each returns its own undo), and ``deactivate`` undoes them in reverse."""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from . import config, variables
from .errors import ActivationError, AlreadyInitializedError, ConfigError, suggestion
from .log import get_logger
from .selection import Selection, build_selection

log = get_logger()
_lock = threading.RLock()
_current: Optional[Selection] = None
#: True while the active selection was made by the launcher, not by the program's own code
_from_launcher = False
_undo: List[Tuple[str, Callable[[], None]]] = []

#: settings that may be changed by assignment, e.g. ``ft.memory_pool_clear_interval = 50``
ASSIGNABLE = ("memory_virtual_limit", "memory_pool_clear_interval", "enable_mixed_precision")
_assigned: dict = {}



def _activate_chip(selection: Selection) -> Optional[Callable[[], None]]:
    return selection.chip.activate(selection)


def _activate_routing(selection: Selection) -> Optional[Callable[[], None]]:
    from . import routing

    return routing.activate(selection)


def _activate_redirect(selection: Selection) -> Optional[Callable[[], None]]:
    from . import redirect

    return redirect.activate(selection)


def _activate_memory(selection: Selection) -> Optional[Callable[[], None]]:
    from . import memory

    return memory.activate(selection)


def _activate_precision(selection: Selection) -> Optional[Callable[[], None]]:
    from . import precision

    return precision.activate(selection)


#: (name, step) in activation order. Each step takes the Selection and returns an undo callable
#: (or None); the layers are imported only when a backend is activated.
ACTIVATION_STEPS: Tuple[Tuple[str, Callable[[Selection], Optional[Callable[[], None]]]], ...] = (
    ("backend", _activate_chip),
    ("routing", _activate_routing),
    ("memory", _activate_memory),
    ("precision", _activate_precision),
    ("redirect", _activate_redirect),
)


def init_backend(
    backend: Optional[Union[str, Sequence[str]]] = None,
    gpu_ids: Optional[Sequence[int]] = None,
    memory_virtual_limit: Any = None,
    memory_pool_clear_interval: Optional[int] = None,
    enable_mixed_precision: Optional[bool] = None,
) -> Selection:
    """Select a backend explicitly (``FL_BACKEND`` and ``run --backend`` still take precedence)
    and activate it. Calling it again with the same settings returns the active selection;
    with different ones it raises: call :func:`deactivate` first. Bad input raises before
    anything changes. Settings left as None take earlier assignments (``ft.<setting> = ...``)."""
    given = {
        "gpu_ids": gpu_ids, "memory_virtual_limit": memory_virtual_limit,
        "memory_pool_clear_interval": memory_pool_clear_interval,
        "enable_mixed_precision": enable_mixed_precision,
    }
    code = {**_assigned, **{k: v for k, v in given.items() if v is not None}}
    global _from_launcher
    with _lock:
        selection = build_selection(backend, code)
        if _current is not None and _from_launcher:
            # the program's own init_backend call refines what the launcher activated
            _from_launcher = False
            if not _current.same_request(selection):
                log.info("init_backend in code re-activates %s with its own settings", selection.backend)
                _replace_active(selection, keep_launcher_mark=True)
            return _current
        if _current is not None:
            if _current.same_request(selection):
                return _current
            change = (f"switch to {selection.backend!r}" if selection.backend != _current.backend
                      else "change them")
            raise AlreadyInitializedError(
                f"backend {_current.backend!r} is already active with devices {list(_current.devices)} "
                f"and other settings; call ft.deactivate() first to {change}"
            )
        _activate(selection)
        return selection


def auto_select_backend(**settings: Any) -> Selection:
    """Pick the highest-priority available backend (``FL_BACKEND`` honoured) and activate it."""
    return init_backend(backend=None, **settings)


def activate_for_launcher() -> Selection:
    """Activation made by ``python -m flagos_torchfl run`` before the program starts: like
    :func:`auto_select_backend`, but a later ``init_backend`` call in the program re-activates
    with the program's settings instead of raising."""
    global _from_launcher
    with _lock:
        selection = auto_select_backend()
        _from_launcher = True
        return selection


def current_backend() -> Optional[Selection]:
    """The active selection, or None."""
    return _current


def deactivate() -> None:
    """Undo every activation step in reverse order; afterwards no backend is active. Raises
    ActivationError (after undoing all it can) if a step could not be undone."""
    global _current, _from_launcher
    with _lock:
        _from_launcher = False
        errors = _undo_all(_undo)
        _undo.clear()
        _current = None
        if errors:
            raise ActivationError("deactivation left work undone: " + "; ".join(errors))


def _undo_all(steps: List[Tuple[str, Callable[[], None]]]) -> List[str]:
    """Run the undos of ``steps`` newest first, each even if an earlier one raised."""
    errors = []
    for name, undo in reversed(steps):
        try:
            undo()
        except Exception as exc:
            log.error("undoing activation step %s failed: %s", name, exc)
            errors.append(f"{name}: {exc}")
    return errors


def _activate(selection: Selection) -> None:
    global _current
    done: List[Tuple[str, Callable[[], None]]] = []
    try:
        for name, step in ACTIVATION_STEPS:
            undo = step(selection)
            if undo is not None:
                done.append((name, undo))
    except BaseException:
        _undo_all(done)
        raise
    _undo.extend(done)
    _current = selection
    log.info("backend %s active (%s): devices %s", selection.backend, selection.reason, list(selection.devices))


def _replace_active(selection: Selection, keep_launcher_mark: bool = False) -> None:
    """Re-activate with ``selection`` in place of the active one; if that fails, the previous
    selection is activated again and the error raised: the process never runs unactivated."""
    global _from_launcher
    previous, was_launcher = _current, _from_launcher
    deactivate()
    try:
        _activate(selection)
    except BaseException:
        _activate(previous)
        _from_launcher = was_launcher or keep_launcher_mark
        raise
    _from_launcher = was_launcher


def get_setting(name: str) -> Any:
    """The current value of an assignable setting (active selection first, then assignments)."""
    if _current is not None:
        return getattr(_current.settings, name)
    return _assigned.get(name, getattr(config.Settings(), name))


def set_setting(name: str, value: Any) -> None:
    """Validate and apply ``ft.<name> = value``. Invalid values raise and change nothing. While a
    backend is active it is re-activated with the new value (restored if that fails); an
    ``FL_*`` variable that sets the same setting still wins, as over any setting in code."""
    if name not in ASSIGNABLE:
        raise ConfigError(f"{name!r} cannot be assigned.{suggestion(name, ASSIGNABLE)} Assignable: {', '.join(ASSIGNABLE)}")
    new = getattr(config.settings_from({name: value}), name)
    variable = variables.SETTING_VARIABLES[name]
    with _lock:
        _assigned[name] = new
        if variables.raw(variable) is not None:
            log.info("%s=%s overrides ft.%s = %r", variable, variables.raw(variable), name, value)
            return
        if _current is not None and getattr(_current.settings, name) != new:
            settings = dataclasses.replace(_current.settings, **{name: new})
            _replace_active(dataclasses.replace(_current, settings=settings))
