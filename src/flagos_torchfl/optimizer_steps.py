"""Training steps as a program takes them: what the memory pool's clear interval, the cpu
backend's memory limit and the routing report's per-step figures count.

A step is an outermost ``Optimizer.step()`` call. An optimizer whose ``step`` runs other
optimizers' steps (torchtitan's ``OptimizersContainer``, a wrapper of one optimizer per model
part) is one step, not one plus one per inner optimizer; separate optimizers stepped one after the
other (a GAN's two) are a step each, as before; so is an optimizer whose ``step`` calls its base
class's (``super().step()``). Torch's global step hooks fire for every ``step`` call, nested or
not: the pre-hook records the step wrapper's frame (a step runs while its frame is on the call
stack), the post-hook counts a step when the outermost one ends.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable, List

_local = threading.local()
_callbacks: List[Callable[[Any], None]] = []
_lock = threading.Lock()
_handles: List[Any] = []


def _running() -> List[Any]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _pre(optimizer, args, kwargs) -> None:
    # the frame of torch's step wrapper that called this hook: a step is running while its
    # frame is on the call stack. A step that raised never reached its post-hooks; its entry is
    # dropped here, once its frame is no longer among the callers.
    stack = _running()
    if stack:
        callers = set()
        frame = sys._getframe(1)
        while frame is not None:
            callers.add(id(frame))
            frame = frame.f_back
        stack[:] = [entry for entry in stack if id(entry) in callers]
    stack.append(sys._getframe(1))


def _post(optimizer, args, kwargs) -> None:
    stack = _running()
    frame = sys._getframe(1)
    if any(entry is frame for entry in stack):
        while stack.pop() is not frame:
            pass
    if not stack:
        for callback in list(_callbacks):
            callback(optimizer)


def after_each_step(callback: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``callback(optimizer)`` after each step (each outermost ``Optimizer.step()``, on any
    thread), with the optimizer whose step ended; returns the undo."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)

    with _lock:
        _callbacks.append(callback)
        if not _handles:
            _handles.extend([register_optimizer_step_pre_hook(_pre), register_optimizer_step_post_hook(_post)])

    def undo() -> None:
        with _lock:
            if callback in _callbacks:
                _callbacks.remove(callback)
            if not _callbacks:
                while _handles:
                    _handles.pop().remove()

    return undo
