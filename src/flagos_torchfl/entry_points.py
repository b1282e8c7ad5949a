"""Loading what third-party distributions register through entry-point groups."""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Tuple

#: the entry points of every distribution on the import path, read once per import path
_scanned: Tuple[tuple, Any] = ((), None)


def group_entry_points(group: str) -> list:
    """The entry points of ``group``. Every distribution's are read once for a given
    ``sys.path`` (one scan serves the backend registry and the kernel providers), again when
    the import path changed."""
    global _scanned
    from importlib.metadata import entry_points

    path = tuple(sys.path)
    if _scanned[0] != path or _scanned[1] is None:
        _scanned = (path, entry_points())
    found = _scanned[1]
    if hasattr(found, "select"):
        return list(found.select(group=group))
    return list(found.get(group, []))  # Python < 3.10: a dict of groups


def load_entry_points(group: str, register: Callable[[Any], Any]) -> Dict[str, str]:
    """Pass the object each entry point of ``group`` names to ``register``; returns, for every
    entry point that failed to load or register, its name -> the reason in plain words."""
    errors = {}
    for ep in group_entry_points(group):
        try:
            register(ep.load())
        except Exception as exc:
            errors[ep.name] = f"entry point {ep.value!r} failed to load: {type(exc).__name__}: {exc}"
    return errors
