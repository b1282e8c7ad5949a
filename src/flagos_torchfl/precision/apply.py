"""Mixed precision on the active backend: the activation step and the public calls
``ft.set_op_precision`` and ``ft.check_finite``.

The step (:func:`activate`), in order:

1. **Autocast rules** where the chip's autocast key (if PyTorch has autocast for its device
   type) casts nothing (PyTorch registers none for
   ``AutocastPrivateUse1``, and a plugin may bring none): CUDA's lists, for the chip's device type
   (sim included). Keys that cast already keep their rules: CUDA's and ROCm's, XPU's, a vendor
   plugin's own, and the CPU's, whose own lists (PyTorch's ``AutocastCPU``) the cpu backend uses
   as they are, so ``torch.autocast("cpu")`` behaves as without this package.
2. ``enable_mixed_precision=True``: every outermost module forward runs under
   ``torch.autocast(<device type>, <the chip's low-precision dtype>)`` (:mod:`.auto_mixed`);
   bfloat16 becomes float16 where the device module says it has no bfloat16.
3. ``FL_FP32_OPS`` (read with the selection): the named operators run in float32 under autocast
   (:mod:`.op_precision`).
4. ``FL_CHECK_FINITE=1`` (read with the selection): the finite guard, naming the route of the failing operator from the
   active router's decisions (:mod:`.finite_guard`).
"""
from __future__ import annotations

import threading
from typing import Callable, List, Optional

import torch

from .. import compat
from ..log import get_logger
from . import _dispatch
from .auto_mixed import enable_mixed_precision
from .autocast_rules import autocast_casts, register_autocast_rules
from .finite_guard import check_finite as _check_finite
from .op_precision import force_float32, set_op_precision as _set_op_precision
from ..selection_view import SelectionView

log = get_logger("precision")
_lock = threading.RLock()
#: the active backend's device type, while the step is active
_device_type: Optional[str] = None
#: undos of what ft.set_op_precision did while the backend is active (undone on deactivate)
_op_undos: List[Callable[[], None]] = []
#: the undo of the finite guard that ft.check_finite / FL_CHECK_FINITE turned on
_guard_undo: Optional[Callable[[], None]] = None


def route_of(op_name: str) -> str:
    """How the active backend ran ``op_name`` (``"aten::exp"``): the route of the active
    router's decision for it (library, composite, fallback), else ``"native"``."""
    from .. import routing

    router = routing.active_router()
    if router is not None:
        routes = {decision.route for name, _, _, decision in router.cached() if name == op_name}
        if routes:
            return "/".join(sorted(routes))
    return "native"


def _mixed_precision(selection: SelectionView) -> Optional[Callable[[], None]]:
    chip = selection.chip
    dtype = getattr(torch, chip.low_precision_dtype)
    supports_bf16 = getattr(chip.device_module(), "is_bf16_supported", None)
    if dtype == torch.bfloat16 and supports_bf16 is not None and not supports_bf16():
        dtype = torch.float16  # e.g. an NVIDIA GPU older than Ampere
    if not compat.autocast_available(chip.device_type):
        log.warning("enable_mixed_precision=True not applied on backend %s: PyTorch has no "
                    "autocast for device type %r", chip.name, chip.device_type)
        return None
    log.info("mixed precision: module forwards under torch.autocast(%r, %s)", chip.device_type, dtype)
    return enable_mixed_precision(chip.device_type, dtype)


def activate(selection: SelectionView) -> Optional[Callable[[], None]]:
    """Activation step (see the module docstring); returns the undo of all of it."""
    global _device_type
    chip = selection.chip
    undos: List[Callable[[], None]] = []
    try:
        key = (_dispatch.autocast_key(chip.device_type)
               if compat.autocast_available(chip.device_type) else None)
        if key is not None and not autocast_casts(key):
            registration = register_autocast_rules(chip.device_type, key)
            log.info("autocast on %s: CUDA's lists registered at %s (%d operators)",
                     chip.device_type, key, len(registration.registered))
            undos.append(registration)
        if selection.settings.enable_mixed_precision:
            undo = _mixed_precision(selection)
            if undo is not None:
                undos.append(undo)
        undos.append(force_float32(selection.fp32_ops, chip.device_type))
        with _lock:
            _device_type = chip.device_type
        undos.append(_forget_backend)
        if selection.check_finite:
            check_finite(True)
    except BaseException:
        for step in reversed(undos):
            step()
        raise

    def undo_all() -> None:
        check_finite(False)
        for step in reversed(undos):
            step()
    return undo_all


def _forget_backend() -> None:
    global _device_type
    with _lock:
        while _op_undos:
            _op_undos.pop()()
        _device_type = None


def _require_backend() -> str:
    if _device_type is None:
        raise RuntimeError("no backend is active: call ft.init_backend() or ft.auto_select_backend() first")
    return _device_type


def set_op_precision(name: str, dtype: torch.dtype = torch.float32) -> Callable[[], None]:
    """Run operator ``name`` (a semantic name such as ``"softmax"``, or an ATen name) in
    ``dtype`` under autocast on the active backend, at its autocast dispatch key. Returns the
    undo; deactivating the backend undoes it too. ConfigError for an unknown name or dtype."""
    with _lock:
        undo = _set_op_precision(name, dtype, _require_backend())
        _op_undos.append(undo)

    def remove() -> None:
        with _lock:
            if undo in _op_undos:
                _op_undos.remove(undo)
                undo()
    return remove


def check_finite(enabled: bool = True) -> None:
    """Turn the finite guard on (``True``) or off (``False``) in the calling thread: the first
    operator whose floating-point output holds NaN/Inf made from finite inputs raises
    :class:`~.finite_guard.NonFiniteError`, naming the operator and its route on the active
    backend. Deactivating the backend turns it off."""
    global _guard_undo
    with _lock:
        if enabled and _guard_undo is None:
            _guard_undo = _check_finite(True, route_of)
        elif not enabled and _guard_undo is not None:
            undo, _guard_undo = _guard_undo, None
            undo()
