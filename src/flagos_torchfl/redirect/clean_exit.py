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
import threading
from typing import Dict, Optional

from .. import threads
from .devices import Target
from ..patching import Patcher
from .patches import patch_function

#: the name torch gives gloo's worker threads (``ProcessGroupGloo::runLoop``)
WORKER_NAME = "pt_gloo_runloop"
#: {"active": True} while the patch is applied
_state: dict = {}
#: tid -> name of the threads born unnamed while c10d built a process group (gloo's workers where
#: torch does not name them); one that has been renamed or has ended since no longer counts
_born: Dict[str, str] = {}


def _gloo_workers() -> Optional[list]:
    """Thread ids of gloo's worker threads in this process: those with torch's name for them and
    those recorded unnamed at a group's construction (still alive, still so named); None where
    threads cannot be listed."""
    names = threads.native_threads()
    if names is None:
        return None
    return sorted(tid for tid, name in names.items()
                  if name == WORKER_NAME or (tid in _born and _born[tid] == name))


def _recording_births(original):
    """c10d's ``_new_process_group_helper`` that records the threads born unnamed (with the name
    of the calling thread, which a new native thread inherits) while it builds the group."""

    @functools.wraps(original)
    def _new_process_group_helper(*args, **kwargs):
        before = threads.native_threads()
        try:
            return original(*args, **kwargs)
        finally:
            after = threads.native_threads()
            if before is not None and after is not None:
                caller = after.get(str(threading.get_native_id()))
                _born.update({tid: name for tid, name in after.items()
                              if tid not in before and name == caller})

    return _new_process_group_helper


def settle(limit_s: float = threads.LIMIT_S) -> bool:
    """Release the GIL until gloo's worker threads have finished with every work they hold
    (:func:`flagos_torchfl.threads.settle`); False when they were still busy after ``limit_s``."""
    return threads.settle(_gloo_workers, "gloo's worker threads", limit_s)


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
