"""``precision_check(model, inputs)``: where does a model drift from a float64 reference?

Runs one forward of ``model`` as it is (on its device, in its dtypes, optionally under autocast)
and one of a float64 CPU deep copy on the same inputs (moved to the CPU, floating ones to
float64), records every module's output with forward hooks, and reports per module the relative
error ``||out - ref|| / ||ref||`` (Frobenius norms over all floating-point tensors the module
returned) and the largest absolute error, largest relative error first. Both forwards run in
eval mode (dropout would make them incomparable); the model's modes are restored afterwards.
"""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
from torch.utils._pytree import tree_map

from ..compat import tree_leaves


@dataclass(frozen=True)
class PrecisionRow:
    """One module call's comparison with the float64 reference."""
    module: str        #: qualified name ("" for the model itself; "name#2" for a second call)
    kind: str          #: the module's class name
    dtype: str         #: dtype of its (first floating) output on the device
    rel_error: float   #: ||out - ref|| / ||ref|| (inf when the output is not finite)
    max_abs_error: float


def _floats(output: Any) -> List[torch.Tensor]:
    return [t for t in tree_leaves(output)
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _record(model: torch.nn.Module, store: Dict[str, List[List[torch.Tensor]]]):
    handles = []
    for name, module in model.named_modules():
        def hook(mod, args, output, name=name):
            floats = _floats(output)
            dtype = str(floats[0].dtype).replace("torch.", "") if floats else ""
            store.setdefault(name, []).append(
                (dtype, [t.detach().to("cpu", torch.float64) for t in floats]))
        handles.append(module.register_forward_hook(hook))
    return handles


def _run(model: torch.nn.Module, args: tuple, kwargs: dict, context) -> Dict[str, list]:
    store: Dict[str, list] = {}
    handles = _record(model, store)
    try:
        with torch.no_grad(), context:
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return store


def _split(inputs: Any) -> tuple:
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _to_reference(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu")
        return value.to(torch.float64) if value.is_floating_point() else value
    return value


def _compare(out: List[torch.Tensor], ref: List[torch.Tensor]) -> tuple:
    num = den = 0.0
    worst = 0.0
    for a, b in zip(out, ref):
        if a.shape != b.shape:
            return math.nan, math.nan
        diff = a - b
        num += float(diff.pow(2).sum())
        den += float(b.pow(2).sum())
        if diff.numel():
            worst = max(worst, float(diff.abs().max()))
    if not math.isfinite(num):
        return math.inf, math.inf
    return (math.sqrt(num) / math.sqrt(den) if den else (0.0 if num == 0 else math.inf)), worst


def precision_check(model: torch.nn.Module, inputs: Any,
                    autocast_dtype: Optional[torch.dtype] = None) -> List[PrecisionRow]:
    """Compare every module's output with a float64 CPU reference; rows largest error first.

    ``inputs``: one tensor, a tuple/list of positional arguments, or a dict of keyword arguments
    (on the model's device). ``autocast_dtype``: run the device forward under
    ``torch.autocast(<device type of the model's first parameter>, autocast_dtype)``; None: as
    the caller's context has it. The model itself is not changed (its train/eval modes are put
    back)."""
    args, kwargs = _split(inputs)
    first = next(model.parameters(), None)
    device_type = first.device.type if first is not None else "cpu"
    reference = copy.deepcopy(model).to(device="cpu", dtype=torch.float64).eval()
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        context = (torch.autocast(device_type, autocast_dtype) if autocast_dtype is not None
                   else contextlib.nullcontext())
        device = _run(model, args, kwargs, context)
    finally:
        for module, training in modes.items():
            module.training = training
    ref = _run(reference, tree_map(_to_reference, args), tree_map(_to_reference, kwargs),
               torch.autocast("cpu", enabled=False))
    kinds = {name: type(m).__name__ for name, m in model.named_modules()}
    rows = []
    for name, calls in device.items():
        for i, ((dtype, out), (_, expected)) in enumerate(zip(calls, ref.get(name, []))):
            if not out:
                continue
            rel, worst = _compare(out, expected)
            label = name if i == 0 else f"{name}#{i + 1}"
            rows.append(PrecisionRow(label, kinds[name], dtype, rel, worst))
    return sorted(rows, key=lambda r: -r.rel_error if not math.isnan(r.rel_error) else 1.0)


def render(rows: List[PrecisionRow], limit: Optional[int] = 20) -> str:
    """A text table of ``rows`` (the first ``limit``; None: all)."""
    shown = rows if limit is None else rows[:limit]
    width = max([len(r.module or "<model>") for r in shown] + [6])
    lines = [f"{'module':<{width}}  {'kind':<24} {'dtype':<9} {'rel err':>10} {'max abs err':>12}"]
    for r in shown:
        lines.append(f"{(r.module or '<model>'):<{width}}  {r.kind[:24]:<24} {r.dtype:<9} "
                     f"{r.rel_error:>10.3e} {r.max_abs_error:>12.3e}")
    if limit is not None and len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more modules")
    return "\n".join(lines)
