"""Leaving cleanly after collectives on gloo (the cpu and sim backends run theirs on it).

torch 2.13's gloo frees a finished collective's work on its own worker thread
(``ProcessGroupGloo::runLoop``). A work started during a backward pass (every DDP bucket's
all-reduce) holds a Python object: the ``contextvars`` context that ``_engine_run_backward`` stashes
in the thread-local state the work captures. Freeing it takes the GIL. If the worker is waiting for
the GIL when the interpreter starts finalizing, CPython ends the thread inside that C++ destructor
and the process aborts ("terminate called without an active exception", SIGABRT); if the main
thread frees the process group while it holds the GIL (``~ProcessGroupGloo`` joins the workers),
the two wait on each other for ever. Both happen after a program has finished its work.

Patch ``clean_exit``: at interpreter exit (an ``atexit`` handler, which runs after the program's own
handlers, Lightning's ``destroy_process_group`` among them) and at the start of each
``dist.destroy_process_group()``, the main thread releases the GIL until every gloo worker thread
of the process has finished with what it held (:func:`settle`). Only waiting is added: no exit
status, exception or teardown of the program is changed, so a program that failed still fails.

gloo's workers are found by the name torch gives them (:data:`WORKER_NAME`). A torch whose gloo
leaves them unnamed (torch 2.1: they carry the process's name) is covered too: while the patch is
applied, the threads born unnamed while c10d builds a process group (``_new_process_group_helper``)
are recorded and settled as well.
"""
from __future__ import annotations

import atexit
import functools
import os
import threading
import time
from typing import Dict, Optional, Tuple

from ..log import get_logger
from .devices import Target
from ..patching import Patcher
from .patches import patch_function

log = get_logger("redirect")

#: the name torch gives gloo's worker threads (``ProcessGroupGloo::runLoop``)
WORKER_NAME = "pt_gloo_runloop"
#: seconds a settle waits at most (a worker still computing a large collective keeps it waiting)
LIMIT_S = 5.0
#: seconds the GIL is released between two looks at the workers
STEP_S = 0.002
#: consecutive unchanged looks after which the workers count as settled
QUIET_LOOKS = 2
_TASKS = "/proc/self/task"

#: {"active": True} while the patch is applied
_state: dict = {}
#: tid -> name of the threads born unnamed while c10d built a process group (gloo's workers where
#: torch does not name them); one that has been renamed or has ended since no longer counts
_born: Dict[str, str] = {}


def _threads() -> Optional[Dict[str, str]]:
    """tid -> name (``/proc/self/task/N/comm``) of this process's threads; None where threads
    cannot be listed."""
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


def _gloo_workers() -> Optional[list]:
    """Thread ids of gloo's worker threads in this process: those with torch's name for them and
    those recorded unnamed at a group's construction (still alive, still so named); None where
    threads cannot be listed."""
    names = _threads()
    if names is None:
        return None
    return sorted(tid for tid, name in names.items()
                  if name == WORKER_NAME or (tid in _born and _born[tid] == name))


def _recording_births(original):
    """c10d's ``_new_process_group_helper`` that records the threads born unnamed (with the name
    of the calling thread, which a new native thread inherits) while it builds the group."""

    @functools.wraps(original)
    def _new_process_group_helper(*args, **kwargs):
        before = _threads()
        try:
            return original(*args, **kwargs)
        finally:
            after = _threads()
            if before is not None and after is not None:
                caller = after.get(str(threading.get_native_id()))
                _born.update({tid: name for tid, name in after.items()
                              if tid not in before and name == caller})

    return _new_process_group_helper


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


def settle(limit_s: float = LIMIT_S) -> bool:
    """Release the GIL until gloo's worker threads have finished with every work they hold.

    Settled means: over :data:`QUIET_LOOKS` consecutive intervals of :data:`STEP_S` seconds with the
    GIL free, no worker was runnable and none ran (a worker waiting for the GIL takes it as soon as
    it is free, and is runnable or has run until it is done). Returns True when settled (at once
    where there are no workers), False after ``limit_s`` seconds. Where the threads cannot be
    listed (no ``/proc``), it releases the GIL for :data:`QUIET_LOOKS` + 1 intervals and returns
    True.
    """
    workers = _gloo_workers()
    if workers is None:
        for _ in range(QUIET_LOOKS + 1):
            time.sleep(STEP_S)
        return True
    if not workers:
        return True
    start = time.monotonic()
    before = _look(workers)
    quiet = 0
    while time.monotonic() - start < limit_s:
        time.sleep(STEP_S)
        now = _look(workers)
        unchanged = now == {tid: seen for tid, seen in before.items() if tid in now}
        if unchanged and all(state not in ("R", "D") for state, _ in now.values()):
            quiet += 1
            if quiet >= QUIET_LOOKS:
                log.debug("gloo's %d worker threads settled in %.1f ms", len(workers),
                          (time.monotonic() - start) * 1e3)
                return True
        else:
            quiet = 0
        before = now
    log.warning("gloo's worker threads were still busy after %.1f s; the process may abort at exit "
                "(torch 2.13 frees their works on their own threads)", limit_s)
    return False


def _settle_at_exit() -> None:
    if _state.get("active"):
        settle()


atexit.register(_settle_at_exit)


@patch_function("clean_exit", waits_for="torch.distributed.distributed_c10d")
def patch_clean_exit(target: Target, patcher: Patcher) -> None:
    """Settle gloo's workers at exit and before ``dist.destroy_process_group()`` tears down;
    record the threads each new process group starts unnamed (see the module's docstring)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group

    @functools.wraps(original)
    def destroy_process_group(*args, **kwargs):
        settle()  # before: the group freed here while a worker waits for the GIL would deadlock
        return original(*args, **kwargs)

    patcher.setitem(_state, "active", True)
    patcher.replace_in((c10d, dist), "destroy_process_group", original, destroy_process_group)
    patcher.wrap(c10d, "_new_process_group_helper", _recording_births)
