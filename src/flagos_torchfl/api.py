"""The functions users call. Selection decides; activation applies the decision through an
ordered list of steps (each returns its own undo), and ``deactivate`` undoes them in reverse."""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from . import active, config, variables
from .errors import ActivationError, AlreadyInitializedError, ConfigError, suggestion
from .log import get_logger
from .selection import Selection, build_selection

log = get_logger()
_lock = threading.RLock()
#: True while the active selection was made by the launcher, not by the program's own code
_from_launcher = False
_undo: List[Tuple[str, Callable[[], None]]] = []

#: settings that may be changed by assignment, e.g. ``ft.memory_pool_clear_interval = 50``
ASSIGNABLE = ("memory_virtual_limit", "memory_pool_clear_interval", "enable_mixed_precision")
#: names that look like settings but are chosen only when a backend is activated
CHOSEN_AT_INIT = {
    "backend": "choose the backend with ft.init_backend(backend=...), FL_BACKEND or "
               "`python -m flagos_torchfl run --backend NAME`",
    "gpu_ids": "choose the devices with ft.init_backend(gpu_ids=[...]) or FL_GPU_IDS "
               "(call ft.deactivate() first to change them)",
}
_assigned: dict = {}



def _activate_chip(selection: Selection) -> Optional[Callable[[], None]]:
    from .machine import activation

    return activation.activate(selection.chip, selection)


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


def _publish_for_children(selection: Selection) -> Optional[Callable[[], None]]:
    """Children started from now on activate as this process: its activation published, and
    the start-up hook handed down (as ``run`` hands it to its program)."""
    from . import inherit

    return inherit.hand_down(selection)


#: (name, step) in activation order. Each step takes the Selection and returns an undo callable
#: (or None); the layers are imported only when a backend is activated.
ACTIVATION_STEPS: Tuple[Tuple[str, Callable[[Selection], Optional[Callable[[], None]]]], ...] = (
    ("backend", _activate_chip),
    ("routing", _activate_routing),
    ("memory", _activate_memory),
    ("precision", _activate_precision),
    ("redirect", _activate_redirect),
    ("children", _publish_for_children),
)


def _update_chip(old: Selection, new: Selection) -> None:
    new.chip.update_settings(old, new)


def _update_children(old: Selection, new: Selection) -> None:
    from . import inherit

    inherit.publish(new)


def _settings_unused(old: Selection, new: Selection) -> None:
    """The step reads none of the assignable settings: nothing to do."""


def _restarting(step: str, *settings: str) -> Callable[[Selection, Selection], None]:
    """An updater that, when one of ``settings`` changed, undoes activation step ``step`` alone
    and runs it again with the new selection (the redirection stays in place meanwhile)."""
    def update(old: Selection, new: Selection) -> None:
        if all(getattr(old.settings, name) == getattr(new.settings, name) for name in settings):
            return
        names = [name for name, _ in ACTIVATION_STEPS]
        at = next((i for i, (name, _) in enumerate(_undo) if name == step), None)
        if at is not None:
            _undo.pop(at)[1]()
        else:
            at = sum(1 for name, _ in _undo if names.index(name) < names.index(step))
        undo = dict(ACTIVATION_STEPS)[step](new)
        if undo is not None:
            _undo.insert(at, (step, undo))

    return update


#: step name -> ``update(old, new)``: applies a change of the assignable settings to the
#: running step in place (raising leaves it as it was). A setting change reaches every step
#: listed here without deactivating anything, so other threads never see torch unpatched; a
#: step not listed (added later) makes the change a full re-activation instead.
SETTING_UPDATES = {
    "backend": _update_chip,
    "routing": _settings_unused,
    "memory": _restarting("memory", "memory_virtual_limit", "memory_pool_clear_interval"),
    "precision": _restarting("precision", "enable_mixed_precision"),
    "redirect": _settings_unused,
    "children": _update_children,
}


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
        current = active.current()
        if current is not None and _from_launcher:
            # the program's own init_backend call refines what the launcher activated
            _from_launcher = False
            if not current.same_request(selection):
                log.info("init_backend in code re-activates %s with its own settings", selection.backend)
                _change_active(selection, keep_launcher_mark=True)
            return active.current()
        if current is not None:
            if current.same_request(selection):
                return current
            change = (f"switch to {selection.backend!r}" if selection.backend != current.backend
                      else "change them")
            raise AlreadyInitializedError(
                f"backend {current.backend!r} is already active with devices {list(current.devices)} "
                f"and other settings; call ft.deactivate() first to {change}"
            )
        _activate(selection)
        return selection


def auto_select_backend(**settings: Any) -> Selection:
    """Pick the highest-priority available backend (``FL_BACKEND`` honoured) and activate it."""
    return init_backend(backend=None, **settings)


def activate_for_launcher() -> Selection:
    """Activation made by ``python -m flagos_torchfl run`` before the program starts, and in
    each Python child: the activation the parent process published (its current one, see
    :mod:`.inherit`) when there is one, else like :func:`auto_select_backend`. A later
    ``init_backend`` call in the program re-activates with the program's settings instead of
    raising."""
    global _from_launcher
    from . import inherit

    with _lock:
        selection = inherit.inherited_selection()
        if selection is None:
            selection = auto_select_backend()
        elif active.current() is None:
            _activate(selection)
        else:
            _change_active(selection)
        _from_launcher = True
        return active.current()


def current_backend() -> Optional[Selection]:
    """The active selection, or None."""
    return active.current()


def deactivate() -> None:
    """Undo every activation step in reverse order; afterwards no backend is active. Raises
    ActivationError (after undoing all it can) if a step could not be undone."""
    global _from_launcher
    with _lock:
        _from_launcher = False
        errors = _undo_all(_undo)
        _undo.clear()
        active.set_current(None)
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
    active.set_current(selection)
    log.info("backend %s active (%s): devices %s", selection.backend, selection.reason, list(selection.devices))


def _change_active(selection: Selection, keep_launcher_mark: bool = False) -> None:
    """Make ``selection`` the active one: in place when only assignable settings differ (see
    :data:`SETTING_UPDATES`), else by re-activation."""
    if _differs_in_settings_only(active.current(), selection):
        _update_active(selection)
    else:
        _replace_active(selection, keep_launcher_mark)


def _differs_in_settings_only(old: Selection, new: Selection) -> bool:
    same_settings = dataclasses.replace(new, settings=old.settings, source=old.source, reason=old.reason)
    return (old.same_request(same_settings)
            and all(name in SETTING_UPDATES for name, _ in ACTIVATION_STEPS))


def _update_active(selection: Selection) -> None:
    """Apply a change of assignable settings to every activation step in place, then make
    ``selection`` current; a step that raises is left as it was and the ones already updated
    are put back, then the error is raised."""
    old, done = active.current(), []
    try:
        for name, _ in ACTIVATION_STEPS:
            SETTING_UPDATES[name](old, selection)
            done.append(name)
    except BaseException:
        for name in reversed(done):
            try:
                SETTING_UPDATES[name](selection, old)
            except Exception as exc:
                log.error("restoring step %s after a failed settings change failed: %s", name, exc)
        raise
    active.set_current(selection)


def _replace_active(selection: Selection, keep_launcher_mark: bool = False) -> None:
    """Re-activate with ``selection`` in place of the active one; if that fails, the previous
    selection is activated again and the error raised: the process never runs unactivated."""
    global _from_launcher
    previous, was_launcher = active.current(), _from_launcher
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
    current = active.current()
    if current is not None:
        return getattr(current.settings, name)
    return _assigned.get(name, getattr(config.Settings(), name))


def set_setting(name: str, value: Any) -> None:
    """Validate and apply ``ft.<name> = value``. Invalid values raise and change nothing. While a
    backend is active the new value is applied in place, without deactivating (other threads
    keep a patched torch throughout); if that fails the previous value stays. An ``FL_*``
    variable that sets the same setting still wins, as over any setting in code."""
    if name in CHOSEN_AT_INIT:
        raise ConfigError(f"ft.{name} cannot be assigned: {CHOSEN_AT_INIT[name]}")
    if name not in ASSIGNABLE:
        raise ConfigError(f"{name!r} cannot be assigned.{suggestion(name, ASSIGNABLE)} Assignable: {', '.join(ASSIGNABLE)}")
    new = getattr(config.settings_from({name: value}), name)
    variable = variables.SETTING_VARIABLES[name]
    with _lock:
        if variables.raw(variable) is not None:
            _assigned[name] = new
            log.info("%s=%s overrides ft.%s = %r", variable, variables.raw(variable), name, value)
            return
        current = active.current()
        if current is not None and getattr(current.settings, name) != new:
            from .selection import check_memory_limit

            settings = dataclasses.replace(current.settings, **{name: new})
            changed = dataclasses.replace(current, settings=settings)
            check_memory_limit(changed)
            _change_active(changed)
        _assigned[name] = new
