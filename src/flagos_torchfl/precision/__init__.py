"""Mixed precision: autocast rules for devices without them, per-operator precision, automatic
mixed precision for scripts without autocast, the finite guard and the precision check.

Each function takes what it acts on (device type, dispatch key, dtype, route lookup) as
arguments and returns an undo where it changes state; :mod:`.activation` applies them for the
active backend (the activation step, ``ft.set_op_precision``, ``ft.check_finite``).
"""
from .auto_mixed import enable_mixed_precision
from .autocast_rules import (Registration, amp_supported_dtypes, autocast_casts, cuda_lists,
                             is_bf16_supported, listed_ops, register_autocast_rules)
from .finite_guard import FiniteGuard, NonFiniteError, check_finite, check_finite_from_env
from .op_precision import force_float32, fp32_ops_from_env, operators_for, parse_fp32_ops, set_op_precision
from ._dispatch import autocast_key
from .apply import activate

__all__ = [
    "register_autocast_rules", "Registration", "listed_ops", "cuda_lists", "autocast_casts",
    "amp_supported_dtypes", "is_bf16_supported", "autocast_key",
    "set_op_precision", "operators_for", "parse_fp32_ops", "fp32_ops_from_env", "force_float32",
    "enable_mixed_precision",
    "check_finite", "check_finite_from_env", "FiniteGuard", "NonFiniteError",
    "precision_check", "render", "PrecisionRow", "activate",
]


def __getattr__(name: str):
    """The precision check (:mod:`.check`), imported when first asked for."""
    if name in ("PrecisionRow", "precision_check", "render"):
        from . import check

        return getattr(check, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
