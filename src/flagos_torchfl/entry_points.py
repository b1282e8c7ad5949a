"""Loading what third-party distributions register through entry-point groups."""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Tuple

#: (distribution, its entry_points.txt) of every distribution with entry points, read once per import path
_scanned: Tuple[tuple, Any] = ((), None)


def _with_entry_points() -> list:
    """(distribution, the text of its entry_points.txt) for each distribution on the import path
    that has entry points; the first of each name only, as ``importlib.metadata.entry_points()``
    takes them. Only texts are kept: parsing every distribution's entry points (most of them
    console scripts) would build hundreds of objects that no caller asks for."""
    from importlib.metadata import distributions

    seen, found = set(), []
    for dist in distributions():
        name = getattr(dist, "_normalized_name", None) or dist.metadata["Name"]
        if name in seen:
            continue
        seen.add(name)
        text = dist.read_text("entry_points.txt")
        if text:
            found.append((dist, text))
    return found


def group_entry_points(group: str) -> list:
    """The entry points of ``group``. Every distribution's are read once for a given
    ``sys.path`` (one scan serves the backend registry and the kernel providers), again when
    the import path changed; only the distributions naming the group are parsed."""
    global _scanned
    path = tuple(sys.path)
    if _scanned[0] != path or _scanned[1] is None:
        _scanned = (path, _with_entry_points())
    header = f"[{group}]"
    return [ep for dist, text in _scanned[1] if header in text
            for ep in dist.entry_points if ep.group == group]


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
