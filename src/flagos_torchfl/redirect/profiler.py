"""The profiler: ``torch.profiler.profile(activities=[CPU, CUDA])`` and
``torch.autograd.profiler.profile(use_device="cuda")`` record the backend's device activity
(``Backend.profiler_activity``: PrivateUse1 on Ascend, Cambricon, Moore Threads and sim) instead
of CUDA's. Off CUDA, a CUDA activity would switch on CUDA event profiling for every operator
(a flood of warnings and timings inflated a thousandfold); a backend with no device activity of
its own (the CPU) records host activity only."""
from __future__ import annotations

import functools

import torch

from .devices import Target
from .patches import Patcher, patch_function


def _activities(target: Target, activities):
    """``activities`` with CUDA replaced by the backend's activity (or dropped)."""
    from torch.profiler import ProfilerActivity

    if activities is None or ProfilerActivity.CUDA not in activities:
        return activities
    kept = [a for a in activities if a != ProfilerActivity.CUDA]
    name = target.chip.profiler_activity
    own = getattr(ProfilerActivity, name, None) if name else None
    if own is not None and own in torch.autograd._supported_activities() and own not in kept:
        kept.append(own)
    return kept


@patch_function("profiler")
def patch_profiler(target: Target, patcher: Patcher) -> None:
    """``torch.profiler.profile`` / ``_KinetoProfile`` activities and the legacy
    ``torch.autograd.profiler.profile(use_device="cuda")``."""
    kineto = torch.profiler.profiler._KinetoProfile
    original = kineto.__init__

    @functools.wraps(original)
    def __init__(self, *args, activities=None, **kwargs):
        original(self, *args, activities=_activities(target, activities), **kwargs)

    patcher.setattr(kineto, "__init__", __init__)
    legacy = torch.autograd.profiler.profile
    own_device = target.device_type if target.chip.profiler_activity == "PrivateUse1" else None

    def edit(values: dict) -> None:
        if values.get("use_device") == "cuda":
            values["use_device"] = own_device

    patcher.wrap_arguments(legacy, "__init__", edit)
