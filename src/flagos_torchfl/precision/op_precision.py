"""Per-operator precision under autocast: ``set_op_precision("softmax", torch.float32)`` and
``FL_FP32_OPS="softmax,layer_norm"``.

The named operators get a kernel at the device's autocast dispatch key (``AutocastCPU`` on the
CPU, ``AutocastCUDA`` on CUDA, ``AutocastPrivateUse1`` on sim and PrivateUse1 chips) that casts
their eligible inputs (floating point, not float64, on the device) to the chosen dtype and runs
them with autocast off for that call. It replaces the key's existing rule for the operator
(PyTorch's, or CUDA's lists registered by :mod:`.autocast_rules`) until undone; outside autocast
nothing changes. Names go through the semantic table
(:func:`flagos_torchfl.aten.names.resolve`) and are also read as ATen spellings:
``softmax`` means ``aten::_softmax``, ``aten::_safe_softmax`` and ``aten::softmax.int``,
``layer_norm`` means ``aten::native_layer_norm`` and ``aten::layer_norm`` -- the composite that
an autocast rule sees first, and the operator it decomposes into. Only functional forward
overloads take the rule: ``out=`` and in-place overloads (casting would write into a copy) and
``*_backward`` operators are left alone.
"""
from __future__ import annotations

from typing import Callable, FrozenSet, Iterable, List, Mapping, Optional, Tuple

import torch

from .. import variables
from ..errors import ConfigError
from ..aten.names import aten_overloads, resolve
from . import _casting, _dispatch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _functional_forward(name: str) -> bool:
    if "backward" in name.partition("::")[2].partition(".")[0]:
        return False
    schema = _dispatch.overload_packet(name)._schema
    return not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def operators_for(name: str) -> FrozenSet[str]:
    """The overloads a precision setting for ``name`` applies to: the functional forward ones
among those the semantic table gives and those the ATen spelling gives (``linear`` also means
``aten::linear``, whose autocast rule runs before the matrix products it decomposes into).
    Raises ConfigError for a name the semantic table does not know, or one that has no such
    overload."""
    meant = resolve(name) | frozenset(aten_overloads(str(name).strip()))
    found = frozenset(o for o in meant if _functional_forward(o))
    if not found:
        raise ConfigError(f"operator name {name!r} has no functional forward overload to set a "
                          f"precision for (it means {', '.join(sorted(meant))})")
    return found


def parse_fp32_ops(text: str) -> List[str]:
    """``"softmax, layer_norm"`` -> ``["softmax", "layer_norm"]``, each checked with
    :func:`operators_for` (ConfigError names the bad entry)."""
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    for name in names:
        try:
            operators_for(name)
        except ConfigError as error:
            raise ConfigError(f"FL_FP32_OPS: {error}") from None
    return names


def set_op_precision(name: str, dtype: torch.dtype, device_type: str,
                     dispatch_key: Optional[str] = None) -> Callable[[], None]:
    """Run operator ``name`` (a semantic or ATen name) in ``dtype`` (float32, float16 or
    bfloat16) under autocast for ``device_type``, at ``dispatch_key`` (default: the device
    type's autocast key). Returns the undo, which brings back the key's previous rule."""
    if dtype not in DTYPES.values():
        raise ConfigError(f"precision {dtype!r} for {name!r} is not one of "
                          f"torch.{', torch.'.join(DTYPES)}")
    key = _dispatch.check_key(dispatch_key or _dispatch.autocast_key(device_type))
    rule = _casting.fixed(dtype, device_type)
    removers = [_dispatch.push(key, op, rule) for op in sorted(operators_for(name))]

    def undo() -> None:
        for remove in reversed(removers):
            remove()
    return undo


def fp32_ops_from_env(environ: Mapping[str, str]) -> Tuple[str, ...]:
    """The operator names ``FL_FP32_OPS`` gives (checked; empty when unset)."""
    return tuple(parse_fp32_ops(variables.read("FL_FP32_OPS", environ) or ""))


def force_float32(names: Iterable[str], device_type: str,
                  dispatch_key: Optional[str] = None) -> Callable[[], None]:
    """Run each operator of ``names`` in float32 under autocast on ``device_type``; returns the
    undo (``FL_FP32_OPS``)."""
    undos = [set_op_precision(n, torch.float32, device_type, dispatch_key) for n in names]

    def undo() -> None:
        for step in reversed(undos):
            step()
    return undo
