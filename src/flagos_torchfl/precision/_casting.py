"""Autocast cast policies as rules for :mod:`._dispatch`, with PyTorch's autocast semantics
(``aten/src/ATen/autocast_mode.h``): only floating-point tensors on the autocast device, never
float64, are cast; the lower-precision dtype is ``compat.autocast_dtype(device_type)`` at the
time of the call; the operator then runs with the autocast key excluded.

Unlike PyTorch's C++ kernels, these rules keep no cache of cast weights: an fp32 weight used by
two operators is cast twice. Results are the same; the cost is one extra cast per reuse.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from .. import compat
from ._dispatch import Rule


def eligible(value: Any, device_type: str) -> bool:
    """A tensor autocast may cast: floating point, not float64, on ``device_type``."""
    return (isinstance(value, torch.Tensor) and value.device.type == device_type
            and value.is_floating_point() and value.dtype != torch.float64)


def cast(value: Any, dtype: torch.dtype, device_type: str) -> Any:
    """``value`` with every eligible tensor in it (directly, or in a list/tuple) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if eligible(value, device_type) and value.dtype != dtype else value
    if isinstance(value, (list, tuple)):
        return type(value)(cast(v, dtype, device_type) for v in value)
    return value


def _tensors(args: tuple, kwargs: dict):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def cast_all(dtype_of: Callable[[], torch.dtype], device_type: str) -> Rule:
    """Policy ``lower_precision_fp`` / ``fp32``: cast every eligible input to ``dtype_of()``."""
    def rule(op, args, kwargs):
        dtype = dtype_of()
        return op(*cast(args, dtype, device_type),
                  **{k: cast(v, dtype, device_type) for k, v in kwargs.items()})
    return rule


@functools.lru_cache(maxsize=None)
def lower_precision(device_type: str) -> Rule:
    """Policy ``lower_precision_fp``: inputs to the autocast dtype in force (one rule per device
    type, shared by its operators)."""
    return cast_all(lambda: compat.autocast_dtype(device_type), device_type)


@functools.lru_cache(maxsize=None)
def fixed(dtype: torch.dtype, device_type: str) -> Rule:
    """Policy ``fp32`` (with ``torch.float32``), or any fixed dtype (one rule per dtype and
    device type, shared by its operators)."""
    return cast_all(lambda: dtype, device_type)


def set_opt_dtype(device_type: str, name: str) -> Rule:
    """Policy ``fp32_set_opt_dtype`` (softmax, sum, cumsum ...): when the first input is eligible
    and the caller gave no ``dtype``, run with ``dtype=torch.float32``; otherwise unchanged."""
    from ._dispatch import schema

    arguments = schema(name).arguments
    index = next(i for i, a in enumerate(arguments) if a.name == "dtype")
    positional = not arguments[index].kwarg_only

    def rule(op, args, kwargs):
        if not (args and eligible(args[0], device_type)):
            return op(*args, **kwargs)
        if positional and len(args) > index:
            if args[index] is None:
                args = (*args[:index], torch.float32, *args[index + 1:])
        elif kwargs.get("dtype") is None:
            kwargs = {**kwargs, "dtype": torch.float32}
        return op(*args, **kwargs)
    return rule


def append_dtype(device_type: str, name: str, target: str) -> Rule:
    """Policy ``fp32_append_dtype`` (``norm``): call ``target``, the overload taking a ``dtype``,
    with float32 when the first input is eligible, else with the first input's dtype."""
    from ._dispatch import overload_packet, schema

    defaults = [a.default_value for a in schema(name).arguments]

    def rule(op, args, kwargs):
        full = list(args) + defaults[len(args):]
        dtype = torch.float32 if eligible(args[0], device_type) else args[0].dtype
        return overload_packet(target)(*full, dtype=dtype)
    return rule


def promote(device_type: str, name: str) -> Rule:
    """Policy ``promote``: run in the widest floating dtype among the eligible inputs (float32 if
    any is float32, else the autocast dtype; float64 inputs are ignored)."""
    def rule(op, args, kwargs):
        lower = compat.autocast_dtype(device_type)
        widest = lower
        for t in _tensors(args, kwargs):
            if t.device.type != device_type or not t.is_floating_point() or t.dtype == torch.float64:
                continue
            if t.dtype == torch.float32 or widest == torch.float32:
                widest = torch.float32
            elif t.dtype != lower:
                raise RuntimeError(
                    f"autocast: {name} got a {t.dtype} input while autocast runs in {lower}; "
                    f"promote needs inputs in {lower} or float32")
        return op(*cast(args, widest, device_type),
                  **{k: cast(v, widest, device_type) for k, v in kwargs.items()})
    return rule


def banned(message: str) -> Rule:
    """An operator autocast refuses (``binary_cross_entropy`` on CUDA): raises ``message``."""
    def rule(op, args, kwargs):
        raise RuntimeError(message)
    return rule
