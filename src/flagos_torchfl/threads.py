"""Native threads of this process that may still free Python objects, waited for before exit.

Some of torch's threads free objects that hold Python references on their own, after the work
that made them has been handed back: gloo's workers free a finished collective's work, and the
autograd engine's device threads a backward's graph task after the backward has returned (both
hold the ``contextvars`` context that torch's ``_engine_run_backward`` stashes in the thread-local
state they capture; with the sim's Python runtime the graph task's last tensors are owned by
Python objects too). Freeing takes the GIL; a thread that asks for it once the
interpreter has begun finalizing is ended by CPython inside that C++ destructor, and the process
aborts ("terminate called without an active exception"). :func:`settle` releases the GIL until
such threads are done, from an exit handler or before a teardown. Threads are found by the
names torch gives them (``/proc/self/task/N/comm``).
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict, Optional, Tuple

from .log import get_logger

log = get_logger("threads")

#: seconds a settle waits at most (a thread still computing keeps it waiting)
LIMIT_S = 5.0
#: seconds the GIL is released between two looks at the threads
STEP_S = 0.002
#: consecutive unchanged looks after which the threads count as settled
QUIET_LOOKS = 2
#: the name torch gives the autograd engine's thread for device N: this prefix and N
AUTOGRAD_DEVICE_THREAD = "pt_autograd_"
_TASKS = "/proc/self/task"


def native_threads() -> Optional[Dict[str, str]]:
    """tid -> name of this process's threads; None where threads cannot be listed."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    names = {}
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/comm") as f:
                names[tid] = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
    return names


def autograd_device_threads() -> Optional[list]:
    """Thread ids of the autograd engine's device threads; None where threads cannot be listed."""
    names = native_threads()
    if names is None:
        return None
    return sorted(tid for tid, name in names.items() if name.startswith(AUTOGRAD_DEVICE_THREAD))


def _look(tids: list) -> Dict[str, Tuple[str, str]]:
    """tid -> (scheduler state, nanoseconds run so far) of each of ``tids`` still alive."""
    seen = {}
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"{_TASKS}/{tid}/schedstat") as f:
                ran = f.read().split()[0]
        except (OSError, IndexError):
            continue
        seen[tid] = (state, ran)
    return seen


def settle(find: Callable[[], Optional[list]], what: str, limit_s: float = LIMIT_S) -> bool:
    """Release the GIL until the threads ``find()`` lists (``what``, for messages) have finished
    with what they hold.

    Settled means: over :data:`QUIET_LOOKS` consecutive intervals of :data:`STEP_S` seconds with the
    GIL free, no thread was runnable and none ran (a thread waiting for the GIL takes it as soon as
    it is free, and is runnable or has run until it is done). Returns True when settled (at once
    where there are none), False after ``limit_s`` seconds, with a warning. Where threads cannot
    be listed (``find()`` is None: no ``/proc``), it releases the GIL for :data:`QUIET_LOOKS` + 1
    intervals and returns True.
    """
    threads = find()
    if threads is None:
        for _ in range(QUIET_LOOKS + 1):
            time.sleep(STEP_S)
        return True
    if not threads:
        return True
    start = time.monotonic()
    before = _look(threads)
    quiet = 0
    while time.monotonic() - start < limit_s:
        time.sleep(STEP_S)
        now = _look(threads)
        unchanged = now == {tid: seen for tid, seen in before.items() if tid in now}
        if unchanged and all(state not in ("R", "D") for state, _ in now.values()):
            quiet += 1
            if quiet >= QUIET_LOOKS:
                log.debug("%s settled in %.1f ms (%d threads)", what, (time.monotonic() - start) * 1e3, len(threads))
                return True
        else:
            quiet = 0
        before = now
    log.warning("%s were still busy after %.1f s; the process may abort at exit (they free "
                "Python objects on their own threads)", what, limit_s)
    return False
