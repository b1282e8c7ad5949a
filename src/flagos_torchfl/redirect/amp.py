"""Mixed precision: ``torch.autocast("cuda")``, ``torch.cuda.amp.autocast()``,
``torch.amp.GradScaler("cuda")`` and ``torch.cuda.amp.GradScaler()`` become the backend's own
autocast and scaler. With no ``dtype=`` given, autocast uses the low-precision dtype the backend
declares (bfloat16 on the CPU) — ``torch.cuda.amp.autocast()``'s float16 default included.
"""
from __future__ import annotations

import functools
import warnings

import torch

from .. import compat
from ..errors import UnsupportedFeatureError
from .devices import Target
from ..patching import Patcher
from .patches import patch_function


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
            elif enabled and dtype == torch.bfloat16 and not target.computes_bfloat16():
                chip = target.device_names[0] if target.device_names else target.chip_name
                raise UnsupportedFeatureError(
                    f"torch.autocast('cuda', dtype=torch.bfloat16): {chip} (backend {target.chip_name!r}) "
                    f"does not compute bfloat16 (torch.{target.device_type}.is_bf16_supported() is False); "
                    "use dtype=torch.float16 with a GradScaler, or choose the dtype with "
                    "torch.cuda.is_bf16_supported()")
            elif enabled and not compat.autocast_takes(device_type, dtype):
                warnings.warn(
                    f"torch.autocast('cuda', dtype={dtype}) runs on {device_type}, whose autocast in "
                    f"torch {torch.__version__} does not take {dtype}: autocast is disabled, as torch "
                    "disables autocast('cuda') on a machine without CUDA")
                dtype, enabled = None, False
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def cuda_autocast_init(self, enabled=True, dtype=None, cache_enabled=True):
        base.__init__(self, "cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    patcher.setattr(base, "__init__", __init__)
    patcher.setattr(torch.cuda.amp.autocast, "__init__", cuda_autocast_init)


@patch_function("grad_scaler")
def patch_grad_scaler(target: Target, patcher: Patcher) -> None:
    """``torch.amp.GradScaler()`` (its default device is "cuda"), ``GradScaler("cuda")`` and
    ``torch.cuda.amp.GradScaler()``: a scaler for the backend's device type. A torch without
    ``torch.amp.GradScaler`` has CUDA's only: ``torch.cuda.amp.GradScaler`` becomes the chip's own
    (its device module's ``amp.GradScaler``, as torch-npu 2.1 has); a chip without one gets CUDA's,
    disabled off CUDA with torch's own warning, as it is without this package on a machine
    without CUDA."""
    if not compat.has("amp_grad_scaler"):
        _patch_cuda_only_grad_scaler(target, patcher)
        return
    scaler = torch.amp.GradScaler
    original = scaler.__init__

    @functools.wraps(original)
    def __init__(self, device="cuda", *args, **kwargs):
        original(self, target.translate_type(device), *args, **kwargs)

    patcher.setattr(scaler, "__init__", __init__)


def _patch_cuda_only_grad_scaler(target: Target, patcher: Patcher) -> None:
    if target.cuda_itself:
        return
    scaler = torch.cuda.amp.GradScaler
    own = getattr(getattr(target.module, "amp", None), "GradScaler", None)
    if isinstance(own, type) and own is not scaler:
        patcher.setattr(torch.cuda.amp, "GradScaler", own)
    original = scaler.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self._enabled:
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  "
                          "Disabling.")
            self._enabled = False

    patcher.setattr(scaler, "__init__", __init__)


@patch_function("autocast_queries")
def patch_autocast_queries(target: Target, patcher: Patcher) -> None:
    """``torch.is_autocast_enabled("cuda")`` (and with no argument), ``torch.get_autocast_dtype("cuda")``
    and the input casts of ``torch.amp.custom_fwd(device_type="cuda", cast_inputs=...)`` answer
    for the backend's device type, so code that checks them sees the autocast that is active.
    The setters ``torch.set_autocast_enabled("cuda", ...)`` and ``torch.set_autocast_dtype("cuda",
    ...)`` set what those queries read: code that saves an answer and restores it later
    (``torch.compile`` does, for every tracing) restores the state it read, never another device
    type's.
    A torch whose queries take no device type (before 2.4) has CUDA's in ``torch.is_autocast_enabled()``
    and ``torch.get_autocast_gpu_dtype()``: they answer for the backend's device type."""
    if not compat.has("autocast_device_queries"):
        enabled, dtype = compat.autocast_query_functions(target.device_type)
        if enabled is None or dtype is None:
            return
        patcher.setattr(torch, "is_autocast_enabled", functools.wraps(torch.is_autocast_enabled)(lambda: enabled()))
        patcher.setattr(torch, "get_autocast_gpu_dtype", functools.wraps(torch.get_autocast_gpu_dtype)(lambda: dtype()))
        return
    mode = torch.amp.autocast_mode
    real_enabled, real_dtype, real_cast = torch.is_autocast_enabled, torch.get_autocast_dtype, mode._cast
    real_set_enabled, real_set_dtype = torch.set_autocast_enabled, torch.set_autocast_dtype

    def is_autocast_enabled(device_type=None):
        return real_enabled(target.device_type if device_type is None else target.translate_type(device_type))

    def get_autocast_dtype(device_type):
        return real_dtype(target.translate_type(device_type))

    def set_autocast_enabled(device_type, enabled=None):
        if enabled is None:  # the one-argument form, which means CUDA, as is_autocast_enabled()
            return real_set_enabled(target.device_type, device_type)
        return real_set_enabled(target.translate_type(device_type), enabled)

    def set_autocast_dtype(device_type, dtype):
        return real_set_dtype(target.translate_type(device_type), dtype)

    def _cast(value, device_type, dtype):
        return real_cast(value, target.translate_type(device_type), dtype)

    patcher.setattr(torch, "is_autocast_enabled", is_autocast_enabled)
    patcher.setattr(torch, "get_autocast_dtype", get_autocast_dtype)
    patcher.setattr(torch, "set_autocast_enabled", set_autocast_enabled)
    patcher.setattr(torch, "set_autocast_dtype", set_autocast_dtype)
    patcher.setattr(mode, "_cast", _cast)
    _gpu_dtype_queries(target, patcher)


def _gpu_dtype_queries(target: Target, patcher: Patcher) -> None:
    """The deprecated ``torch.get_autocast_gpu_dtype()`` / ``set_autocast_gpu_dtype(dtype)``,
    which mean CUDA's autocast, answer for the backend's device type (inside
    ``torch.autocast("cuda", dtype=torch.bfloat16)`` the first returns ``bfloat16``). Each still
    calls torch's own first, for its deprecation warning (the setter also sets CUDA's slot,
    which nothing reads while the backend answers for CUDA)."""
    real_get, real_set = getattr(torch, "get_autocast_gpu_dtype", None), getattr(torch, "set_autocast_gpu_dtype", None)
    if real_get is None or real_set is None:
        return
    real_dtype, real_set_dtype = torch.get_autocast_dtype, torch.set_autocast_dtype

    @functools.wraps(real_get)
    def get_autocast_gpu_dtype():
        real_get()
        return real_dtype(target.device_type)

    @functools.wraps(real_set)
    def set_autocast_gpu_dtype(dtype):
        real_set(dtype)
        return real_set_dtype(target.device_type, dtype)

    patcher.setattr(torch, "get_autocast_gpu_dtype", get_autocast_gpu_dtype)
    patcher.setattr(torch, "set_autocast_gpu_dtype", set_autocast_gpu_dtype)
