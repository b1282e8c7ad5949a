"""The router of the active backend and its census, while routing is active: written by the
package's activation step (:func:`flagos_torchfl.routing.activate`), read by the report and the
verdict. A leaf of the routing package."""
from __future__ import annotations

import threading
from typing import Any, Optional, Tuple

lock = threading.Lock()
_active: Tuple[Optional[Any], Optional[Any]] = (None, None)


def set_active(router: Optional[Any], census: Optional[Any]) -> None:
    """Make ``router`` (with its census, for the verdict) the active one; None, None: none."""
    global _active
    _active = (router, census)


def active_router():
    """The router of the active backend, or None."""
    return _active[0]


def current_verdict():
    """The verdict of the run so far (see :mod:`.verdict`), or None when routing is not active."""
    from .verdict import verdict as build

    router, census = _active
    return None if router is None or census is None else build(router, census)
