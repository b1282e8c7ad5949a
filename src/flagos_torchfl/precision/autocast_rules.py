"""Autocast on a device whose autocast key has no casting kernels.

PyTorch registers autocast rules for CUDA, CPU, XPU, MPS ... in C++; ``AutocastPrivateUse1``
gets none, so ``torch.autocast("<privateuse1 device>", torch.bfloat16)`` casts nothing unless the
chip's plugin brings rules of its own. :func:`register_autocast_rules` registers CUDA's operator
lists (the data file ``flagos_torchfl/data/autocast_cuda.json``, read from PyTorch's sources, with
their provenance) at such a key, with CUDA's cast policies:

- ``lower_precision_fp`` (matmul, linear, convolutions, attention ...): inputs to the autocast dtype;
- ``fp32`` (exp, log, pow, layer_norm, the losses ...): inputs to float32;
- ``fp32_set_opt_dtype`` (softmax, log_softmax, sum, cumsum ...): ``dtype=float32`` unless given;
- ``fp32_append_dtype`` (``norm``): the dtype-taking overload with float32;
- ``promote`` (addcmul, addcdiv, dot, index_put ...): the widest input dtype;
- ``banned`` (``binary_cross_entropy``): CUDA's error, advising the ``_with_logits`` form.

The kernels only run while autocast is enabled for the device (PyTorch keeps the key excluded
otherwise) and only touch eligible tensors (see :mod:`._casting`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch

from ..aten import dispatcher
from ..data_files import read_json
from . import _casting, _dispatch

#: what CUDA's autocast raises for ``binary_cross_entropy`` (``aten/src/ATen/autocast_mode.cpp``),
#: word for word: code that matches it behaves as on CUDA
BCE_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")

#: Operators whose casting kernel shows that a key really autocasts (every one must have one).
CORE_OPS = dispatcher.AUTOCAST_CORE_OPS


@functools.lru_cache(maxsize=1)
def cuda_lists() -> dict:
    """The parsed data file: ``{"about", "provenance", "policies"}``; ``policies`` maps each
    policy to its operators (``fp32_append_dtype``: operator -> the overload it calls)."""
    return read_json("autocast_cuda.json")


def listed_ops() -> Dict[str, str]:
    """Every operator in CUDA's lists -> its policy."""
    return {op: policy for policy, ops in cuda_lists()["policies"].items() for op in ops}


def _rule(policy: str, name: str, device_type: str) -> _dispatch.Rule:
    if policy == "lower_precision_fp":
        return _casting.lower_precision(device_type)
    if policy == "fp32":
        return _casting.fixed(torch.float32, device_type)
    if policy == "fp32_set_opt_dtype":
        return _casting.set_opt_dtype(device_type, name)
    if policy == "fp32_append_dtype":
        return _casting.append_dtype(device_type, name, cuda_lists()["policies"][policy][name])
    if policy == "promote":
        return _casting.promote(device_type, name)
    if policy == "banned":
        return _casting.banned(BCE_MESSAGE)
    raise ValueError(f"unknown autocast policy {policy!r} in the data file")


@dataclass
class Registration:
    """What :func:`register_autocast_rules` did. Calling it (or :meth:`undo`) removes every
    kernel it registered; idempotent."""
    dispatch_key: str
    device_type: str
    registered: Tuple[str, ...]
    #: Operators left alone because the key already had a kernel for them (the plugin's own).
    kept: Tuple[str, ...]
    _removers: List[Callable[[], None]] = field(default_factory=list, repr=False)

    def undo(self) -> None:
        while self._removers:
            self._removers.pop()()

    __call__ = undo


def register_autocast_rules(device_type: str, dispatch_key: Optional[str] = None,
                            ops: Optional[Iterable[str]] = None,
                            replace: bool = False) -> Registration:
    """Register CUDA's autocast rules for ``device_type`` (the torch device type whose tensors
    they cast, e.g. ``"sim"``, ``"npu"``) at ``dispatch_key`` (default: the device type's
    autocast key, ``AutocastPrivateUse1`` for the PrivateUse1 device). ``ops``: a subset of the
    listed operators (default: all of them). An operator that already has a kernel at the key
    that this package did not register (a vendor plugin's own rule, PyTorch's CPU rule) is kept,
    unless ``replace`` (then CUDA's rule runs there until undone, e.g. to give the CPU CUDA's
    operator precisions; the key's operators outside CUDA's lists keep their rules).

    Returns a :class:`Registration`; call it to remove the kernels again. Raises ValueError for a
    device type without autocast, a key that is not an autocast key, or an operator not in
    CUDA's lists. The lists come from one torch release; operators an older torch lacks
    (``aten::rms_norm`` before 2.4) are left out of the default set here."""
    key = _dispatch.check_key(dispatch_key or _dispatch.autocast_key(device_type))
    policies = listed_ops()
    present = frozenset(dispatcher.all_aten())
    chosen = [op for op in policies if op in present] if ops is None else list(ops)
    unknown = [op for op in chosen if op not in policies]
    if unknown:
        raise ValueError(f"not in CUDA's autocast lists: {', '.join(unknown)}; "
                         f"valid: the {len(policies)} operators of listed_ops()")
    absent = [op for op in chosen if op not in present]
    if absent:
        raise ValueError(f"not in this torch ({torch.__version__}): {', '.join(absent)}")
    registered, kept, removers = [], [], []
    try:
        for name in chosen:
            if (not replace and torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
                    and not _dispatch.is_ours(key, name)):
                kept.append(name)
                continue
            removers.append(_dispatch.push(key, name, _rule(policies[name], name, device_type)))
            registered.append(name)
    except BaseException:
        for remove in reversed(removers):
            remove()
        raise
    return Registration(key, device_type, tuple(registered), tuple(kept), removers)


def autocast_casts(dispatch_key: str) -> bool:
    """Whether autocast at ``dispatch_key`` really casts: every core operator (:data:`CORE_OPS`:
    linear, mm, addmm, bmm, matmul, conv2d) has a kernel there (PyTorch's, a plugin's, or ours)."""
    return dispatcher.autocast_casts(_dispatch.check_key(dispatch_key))


def amp_supported_dtypes(dispatch_key: str,
                         compute_dtypes: Iterable[torch.dtype]) -> List[torch.dtype]:
    """The answer for a device module's ``get_amp_supported_dtype()``: the low-precision dtypes
    the chip computes (``compute_dtypes``, e.g. ``[torch.float16, torch.bfloat16]``) when its
    autocast key casts (:func:`autocast_casts`), else an empty list — autocast would cast
    nothing, and ``torch.autocast`` then warns and stays off instead of pretending."""
    return list(compute_dtypes) if autocast_casts(dispatch_key) else []


def is_bf16_supported(dispatch_key: str, compute_dtypes: Iterable[torch.dtype]) -> bool:
    """The answer for ``is_bf16_supported()``: bfloat16 is among :func:`amp_supported_dtypes`."""
    return torch.bfloat16 in amp_supported_dtypes(dispatch_key, compute_dtypes)
