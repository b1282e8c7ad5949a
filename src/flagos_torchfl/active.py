"""The selection active in this process: what ``ft.current_backend()`` answers (None before
activation and after deactivation). A leaf: the api sets it as an activation completes and
clears it as deactivation completes; the layers below the api (memory figures, checkpoints) read
it here, without importing the api."""
from __future__ import annotations

from typing import Any, Optional

_selection: Optional[Any] = None


def current() -> Optional[Any]:
    """The active :class:`~flagos_torchfl.selection.Selection`, or None."""
    return _selection


def set_current(selection: Optional[Any]) -> None:
    """Make ``selection`` the active one (None: no backend is active)."""
    global _selection
    _selection = selection
