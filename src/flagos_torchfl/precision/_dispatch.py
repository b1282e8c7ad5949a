"""Python kernels at an autocast dispatch key, one per (key, operator), each applying the newest
of the cast rules stacked on it.

Several parts of the package may want a rule on the same operator at the same key (CUDA's lists
on a PrivateUse1 chip, then ``set_op_precision`` on top). PyTorch keeps one active kernel per
(operator, key); so this module registers one Python kernel per (key, operator) and keeps a stack
of rules behind it: the newest rule runs, removing a rule re-exposes the one below, and removing
the last one destroys the registration, which brings back whatever kernel the key had before (a
C++ autocast kernel, or none). A rule is ``rule(op, args, kwargs) -> result``; it runs with the
key excluded, as PyTorch's own autocast kernels do, so the calls it makes are not autocast again.
"""
from __future__ import annotations

import itertools
import threading
import warnings
from typing import Any, Callable, Dict, List, Tuple

import torch

from .. import compat
from ..registrations import keep_at_exit

Rule = Callable[[Any, tuple, dict], Any]

_lock = threading.Lock()
_counter = itertools.count()
_slots: Dict[Tuple[str, str], "_Slot"] = {}


def autocast_key(device_type: str) -> str:
    """The autocast dispatch key of a device type: ``"cpu"`` -> ``"AutocastCPU"``, ``"cuda"`` ->
    ``"AutocastCUDA"``, the PrivateUse1 device type (``"sim"``, ``"npu"`` ...) ->
    ``"AutocastPrivateUse1"``. Raises ValueError for a device type without autocast."""
    key = "Autocast" + compat.autocast_dispatch_suffix(device_type)
    if not hasattr(torch._C.DispatchKey, key):
        raise ValueError(f"device type {device_type!r} has no autocast dispatch key ({key})")
    return key


def check_key(dispatch_key: str) -> str:
    """``dispatch_key`` if it names an autocast key, else ValueError listing them."""
    valid = sorted(k for k in dir(torch._C.DispatchKey) if k.startswith("Autocast")
                   and k != "AutocastFunctionality")
    if dispatch_key not in valid:
        raise ValueError(f"{dispatch_key!r} is not an autocast dispatch key; valid: {', '.join(valid)}")
    return dispatch_key


def overload_packet(name: str):
    """``"aten::softmax.int"`` -> ``torch.ops.aten.softmax.int`` (``"aten::exp"``: ``.default``)."""
    ns, _, rest = name.partition("::")
    op, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload or "default")


class _Slot:
    """The kernel of one (key, operator) and its stack of rules. The registration is a bare
    dispatcher library (``torch._C._dispatch_library``, what ``torch.library.Library`` wraps):
    dropping it deregisters the kernel, and it costs no Python bookkeeping or finalizer."""
    __slots__ = ("key", "name", "op", "rules", "handle", "__weakref__")

    def __init__(self, dispatch_key: str, name: str):
        self.key = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, dispatch_key))
        self.name = name
        self.op = None  # the OpOverload, found at the first call (finding it costs at activation)
        self.rules: List[Tuple[int, Rule]] = []
        namespace, _, op_name = name.partition("::")
        self.handle = torch._C._dispatch_library("IMPL", namespace, "")
        with warnings.catch_warnings():
            # Replacing a C++ autocast kernel warns; the replacement is the point here.
            warnings.simplefilter("ignore")
            self.handle.impl(op_name, dispatch_key, self)

    def __call__(self, *args, **kwargs):
        rule = self.rules[-1][1]
        if self.op is None:
            self.op = overload_packet(self.name)
        with torch._C._ExcludeDispatchKeyGuard(self.key):
            return rule(self.op, args, kwargs)

    def destroy(self) -> None:
        """Deregister the kernel: the key's kernel before it (a C++ one, or none) serves again."""
        handle, self.handle = self.handle, None
        reset = getattr(handle, "reset", None)  # torch 2.1's library handle has none: dropping it is enough
        if reset is not None:
            reset()


class _Removal:
    """The undo of one :func:`push`: takes its rule off the stack (idempotent)."""
    __slots__ = ("slot", "token", "where")

    def __init__(self, slot: _Slot, token: int, where: Tuple[str, str]):
        self.slot, self.token, self.where = slot, token, where

    def __call__(self) -> None:
        with _lock:
            slot = self.slot
            slot.rules[:] = [r for r in slot.rules if r[0] != self.token]
            if not slot.rules and _slots.get(self.where) is slot:
                del _slots[self.where]
                slot.destroy()


def schema(name: str) -> torch._C.FunctionSchema:
    """The schema of overload ``name`` (``"aten::softmax.int"``), read from the dispatcher
    without building its Python packet."""
    op, _, overload = name.partition(".")
    return torch._C._get_schema(op, overload)


def is_ours(dispatch_key: str, name: str) -> bool:
    """Whether this module's kernel serves ``name`` at ``dispatch_key`` now."""
    return (dispatch_key, name) in _slots


def push(dispatch_key: str, name: str, rule: Rule) -> Callable[[], None]:
    """Make ``rule`` the active autocast rule of operator ``name`` at ``dispatch_key``; returns
    the function that removes it again (idempotent; rules may be removed in any order)."""
    where = (dispatch_key, name)
    with _lock:
        slot = _slots.get(where)
        if slot is None:
            slot = _slots[where] = keep_at_exit(_Slot(dispatch_key, name))
        token = next(_counter)
        slot.rules.append((token, rule))
    return _Removal(slot, token, where)
