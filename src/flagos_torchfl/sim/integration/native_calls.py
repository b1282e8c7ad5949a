"""The count of the sim's native operator calls that the routing census reads
(:meth:`flagos_torchfl.backends.sim.SimBackend.count_native_calls`): its Python kernels' calls,
heard through their observer, and the C++ route's, counted in C++ (so a C++ kernel call never
enters Python for it)."""
from __future__ import annotations

import threading
from typing import Dict, List

from ..operators import kernels
from ..runtime import state


class NativeCalls:
    """Calls and host nanoseconds per overload from creation until :meth:`stop`, except the
    calls a thread makes while paused (:meth:`pause`: inside a route, whose work they are).
    One at a time: a new one restarts the C++ counts."""

    def __init__(self):
        self._cpp = state.cpp_runtime()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._heard: Dict[str, List[int]] = {}
        kernels.set_observer(self._observe)
        if self._cpp is not None:
            self._cpp.count_calls(True)

    def _observe(self, name: str, ns: int) -> None:
        if getattr(self._local, "paused", False):
            return
        with self._lock:
            row = self._heard.get(name)
            if row is None:
                row = self._heard[name] = [0, 0]
            row[0] += 1
            row[1] += ns

    def pause(self, paused: bool) -> None:
        """The calling thread begins (True) or ends (False) running a route."""
        self._local.paused = paused
        if self._cpp is not None:
            self._cpp.pause_counting(paused)

    def rows(self) -> Dict[str, List[int]]:
        """``{overload: [calls, nanoseconds]}`` counted so far (after :meth:`stop` too)."""
        with self._lock:
            rows = {name: list(row) for name, row in self._heard.items()}
        if self._cpp is not None:
            for name, (calls, ns) in self._cpp.call_counts().items():
                row = rows.setdefault(name, [0, 0])
                row[0] += calls
                row[1] += ns
        return rows

    def stop(self) -> None:
        """Stop counting; :meth:`rows` keeps what was counted."""
        kernels.set_observer(None)
        if self._cpp is not None:
            self._cpp.count_calls(False)
