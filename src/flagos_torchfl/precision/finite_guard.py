"""The finite guard (``check_finite(True)`` / ``FL_CHECK_FINITE=1``): raise at the first operator
that turns finite inputs into NaN or Inf, naming the operator and the route that ran it.

A debugging tool, off by default. It is a ``TorchDispatchMode``, so it sees every ATen operator
that reaches the backend, forward and backward (the backward pass when ``backward()`` is called
with the guard on), after composite operators decomposed (``softmax`` shows as ``aten::_softmax``)
and after autocast casts. Per operator it checks each floating-point output with
``isfinite().all()`` and, for in-place operators, the written inputs before the call. An output
that is not finite is an error only when the operator introduced it: every floating-point input
was finite and no scalar argument was itself Inf/NaN (``masked_fill(mask, -inf)`` and
``full(..., -inf)`` are deliberate; values that were already non-finite only propagate). Not
checked: view operators (their output is their input), operators returning uninitialised memory
(``empty*``, ``new_empty*``, ``resize_``, ``set_``), integer and boolean outputs.

Cost: one reduction and one host synchronisation per floating-point output, plus the Python
dispatch of every operator: a small MLP training step (64-128-10, batch 32, Adam, CPU) takes
about 5x as long (benchmarks/precision_costs.py).
"""
from __future__ import annotations

import math
from typing import Any, Callable, List, Mapping, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import variables
from ..compat import tree_leaves
from ..errors import FlagOSError

RouteOf = Callable[[str], str]
_UNINITIALISED = ("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                  "new_empty_strided", "resize_", "set_")


class NonFiniteError(FlagOSError, FloatingPointError):
    """An operator produced NaN/Inf from finite inputs. ``op``: its name (``aten::exp``);
    ``route``: how it ran (native, library, composite, fallback)."""

    def __init__(self, op: str, route: str, detail: str):
        self.op, self.route = op, route
        super().__init__(f"{op} (route: {route}) produced non-finite values from finite inputs: "
                         f"{detail}")


def _native(op_name: str) -> str:
    return "native"


def _floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


def _finite(tensor: torch.Tensor) -> bool:
    return tensor.numel() == 0 or bool(torch.isfinite(tensor).all())


def _written_inputs(func, args: tuple, kwargs: dict) -> List[torch.Tensor]:
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
        written.extend(t for t in tree_leaves(value) if _floating(t))
    return written


def _describe(tensor: torch.Tensor, index: int) -> str:
    bad = int((~torch.isfinite(tensor)).sum())
    return (f"output {index} ({str(tensor.dtype).replace('torch.', '')}{list(tensor.shape)} on "
            f"{tensor.device}) has {bad} of {tensor.numel()} values NaN/Inf")


class FiniteGuard(TorchDispatchMode):
    """The guard as a dispatch mode (``with FiniteGuard(route_of): ...``). ``route_of``: operator
    name (``"aten::exp"``, ``"aten::add.Tensor"``) -> the route that runs it; default: native."""

    def __init__(self, route_of: Optional[RouteOf] = None):
        super().__init__()
        self.route_of = route_of or _native

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.is_view or func._schema.name.partition("::")[2] in _UNINITIALISED:
            return func(*args, **kwargs)
        written = _written_inputs(func, args, kwargs)
        written_finite = all(_finite(t) for t in written)
        out = func(*args, **kwargs)
        for index, tensor in enumerate(t for t in tree_leaves(out) if _floating(t)):
            if not _finite(tensor):
                if written_finite and self._inputs_finite(args, kwargs, written):
                    raise NonFiniteError(func.name(), self.route_of(func.name()),
                                         _describe(tensor, index))
                break
        return out

    @staticmethod
    def _inputs_finite(args: tuple, kwargs: dict, written: List[torch.Tensor]) -> bool:
        for value in tree_leaves((args, kwargs)):
            if isinstance(value, float) and not math.isfinite(value):
                return False
            if _floating(value) and not any(value is w for w in written) and not _finite(value):
                return False
        return True


def check_finite(enabled: bool = True, route_of: Optional[RouteOf] = None) -> Callable[[], None]:
    """Turn the guard on for the calling thread (and the autograd work it starts); returns the
    undo. ``enabled=False`` does nothing and returns a no-op undo. Undo in the reverse order of
    other dispatch modes entered after it."""
    if not enabled:
        return lambda: None
    guard = FiniteGuard(route_of)
    guard.__enter__()
    done = []

    def undo() -> None:
        if not done:
            done.append(True)
            guard.__exit__(None, None, None)
    return undo


def check_finite_from_env(environ: Mapping[str, str],
                          route_of: Optional[RouteOf] = None) -> Callable[[], None]:
    """Apply ``FL_CHECK_FINITE`` from ``environ``; returns the undo."""
    return check_finite(variables.read("FL_CHECK_FINITE", environ), route_of)
