"""The package's dispatcher registrations at process exit: left in place, not taken out.

A ``torch.library.Library`` takes its kernels out of the dispatcher when it is destroyed, and at
exit torch destroys every library still alive (its finalizers run from ``atexit``). Taking out a
backend fallback rebuilds every operator's dispatch entry (a few milliseconds apiece), work that
a process which is ending has no use for: the sim's libraries made its exit about 12 ms slower
than plain torch's. An object given to :func:`keep_at_exit` (a ``Library``, or any object that
holds a bare dispatcher registration) is kept alive through the interpreter's end instead, so its
registrations stay until the process is gone, as the sim's C++ runtime keeps its own. Taking
them out earlier (``ft.deactivate()``, a router's uninstall) works as before; the kernels stay
callable while later exit handlers run.
"""
from __future__ import annotations

import atexit
import ctypes
import threading
import weakref
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_kept: "weakref.WeakSet[object]" = weakref.WeakSet()
_registered = False


def keep_at_exit(obj: T) -> T:
    """Keep ``obj`` and its dispatcher registrations through the process's exit; returns ``obj``.
    ``obj`` must accept weak references (``torch.library.Library`` does)."""
    global _registered
    with _lock:
        _kept.add(obj)
        if not _registered:
            # registered after torch's finalizers' exit handler (torch made libraries before
            # ``obj``), so it runs before it: atexit runs the newest first
            atexit.register(_keep_all)
            _registered = True
    return obj


def _keep_all() -> None:
    """At exit: a reference that is never dropped to each kept object, and their ``Library``
    finalizers detached (torch's exit handler would otherwise destroy them)."""
    with _lock:
        kept = list(_kept)
    if not kept:
        return
    for obj in kept:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    ids = {id(obj) for obj in kept}
    for finalizer, info in list(getattr(weakref.finalize, "_registry", {}).items()):
        if id(info.weakref()) in ids:
            finalizer.detach()
