"""Mixed precision: ``torch.autocast("cuda")``, ``torch.cuda.amp.autocast()``,
``torch.amp.GradScaler("cuda")`` and ``torch.cuda.amp.GradScaler()`` become the backend's own
autocast and scaler. With no ``dtype=`` given, autocast uses the low-precision dtype the backend
declares (bfloat16 on the CPU) — ``torch.cuda.amp.autocast()``'s float16 default included.
"""
from __future__ import annotations

import functools

import torch

from .devices import Target
from .patches import Patcher, patch_function


@patch_function("autocast")
def patch_autocast(target: Target, patcher: Patcher) -> None:
    """``torch.autocast("cuda", ...)`` / ``torch.amp.autocast`` / ``torch.cuda.amp.autocast``."""
    base = torch.amp.autocast_mode.autocast
    original = base.__init__
    low = target.low_precision_dtype

    @functools.wraps(original)
    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "cuda":
            device_type = target.device_type
            if dtype is None:
                dtype = low
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def cuda_autocast_init(self, enabled=True, dtype=None, cache_enabled=True):
        base.__init__(self, "cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    patcher.setattr(base, "__init__", __init__)
    patcher.setattr(torch.cuda.amp.autocast, "__init__", cuda_autocast_init)


@patch_function("grad_scaler")
def patch_grad_scaler(target: Target, patcher: Patcher) -> None:
    """``torch.amp.GradScaler()`` (its default device is "cuda"), ``GradScaler("cuda")`` and
    ``torch.cuda.amp.GradScaler()``: a scaler for the backend's device type."""
    scaler = torch.amp.GradScaler
    original = scaler.__init__

    @functools.wraps(original)
    def __init__(self, device="cuda", *args, **kwargs):
        original(self, target.translate_type(device), *args, **kwargs)

    patcher.setattr(scaler, "__init__", __init__)
