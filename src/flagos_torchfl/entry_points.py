"""Loading what third-party distributions register through entry-point groups."""
from __future__ import annotations

from typing import Any, Callable, Dict


def load_entry_points(group: str, register: Callable[[Any], Any]) -> Dict[str, str]:
    """Pass the object each entry point of ``group`` names to ``register``; returns, for every
    entry point that failed to load or register, its name -> the reason in plain words."""
    from importlib.metadata import entry_points

    try:
        eps = entry_points(group=group)
    except TypeError:  # Python < 3.10
        eps = entry_points().get(group, [])
    errors = {}
    for ep in eps:
        try:
            register(ep.load())
        except Exception as exc:
            errors[ep.name] = f"entry point {ep.value!r} failed to load: {type(exc).__name__}: {exc}"
    return errors
