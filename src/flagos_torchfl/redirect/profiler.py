"""The profiler: what CUDA code asks of it is asked of the backend's device.

* ``torch.profiler.profile(activities=[..., CUDA])`` (every ``_KinetoProfile``) records the
  backend's own activity instead (``Backend.profiler_activity``: PrivateUse1 on Ascend,
  Cambricon, Moore Threads and sim); on a backend whose device is the host (the CPU) the CUDA
  activity is host activity, CPU. Off CUDA, a CUDA activity switched on CUDA event timing for
  every operator: a C++ warning with its stack trace per operator and timings about 1000x too
  large, and ``activities=[CUDA]`` alone had nothing left to record.
* ``torch.autograd.profiler.profile(use_device="cuda")`` and its deprecated spelling
  ``use_cuda=True`` (where the installed torch has it) time each operator on the backend's
  device (``use_device`` its device type: the chip's profiler stubs, the sim's host timestamps),
  or on the host alone (the CPU).
* ``torch.autograd.profiler.emit_nvtx()`` asks for NVTX ranges around each operator, which
  only CUDA's tools take: off CUDA it is a context manager with torch's contract (not
  reentrant, synchronises the device on entry and exit) that records nothing.
* ``torch.cuda.profiler.start()`` / ``stop()`` / ``profile()`` open and close the capture range
  of an external CUDA profiler (``cudaProfilerStart``): with no CUDA device there is no such
  capture to open, and they do nothing.
"""
from __future__ import annotations

import functools
import warnings

import torch

from .devices import Target
from ..patching import Patcher
from .patches import patch_function


def own_activity(target: Target):
    """The ``ProfilerActivity`` that records the backend's device work: the chip's own when
    this torch supports it, else CPU (the host does the work, or nothing else can record it)."""
    from torch.profiler import ProfilerActivity

    name = target.chip.profiler_activity
    own = getattr(ProfilerActivity, name, None) if name else None
    if own is not None and own in torch.autograd._supported_activities():
        return own
    return ProfilerActivity.CPU


def translate_activities(target: Target, activities):
    """``activities`` (bare activities, or dicts of activity -> event filters) with CUDA replaced
    by :func:`own_activity`, each activity once; any other list is returned as it is."""
    from torch.profiler import ProfilerActivity

    if activities is None:
        return activities
    items = list(activities)
    keys = [k for item in items for k in (item if isinstance(item, dict) else (item,))]
    if ProfilerActivity.CUDA not in keys:
        return activities
    own = own_activity(target)
    kept, seen = [], set()
    for item in items:
        if isinstance(item, dict):
            rest = {k: v for k, v in item.items() if k != ProfilerActivity.CUDA and k not in seen}
            if rest:
                kept.append(rest)
                seen.update(rest)
            if ProfilerActivity.CUDA in item and own not in seen:
                kept.append(own)  # CUDA's event filters name CUDA's kinds of events
                seen.add(own)
            continue
        replaced = own if item == ProfilerActivity.CUDA else item
        if replaced not in seen:
            kept.append(replaced)
            seen.add(replaced)
    return kept


def own_device(target: Target):
    """The ``use_device`` of the legacy profiler that times the backend's device: its device
    type where its activity is PrivateUse1, None (host timings only) otherwise."""
    from torch.profiler import ProfilerActivity

    private_use1 = getattr(ProfilerActivity, "PrivateUse1", None)  # torch 2.1 has none
    return target.device_type if private_use1 is not None and own_activity(target) == private_use1 else None


@patch_function("profiler")
def patch_profiler(target: Target, patcher: Patcher) -> None:
    """``torch.profiler.profile`` / ``_KinetoProfile`` activities and the legacy
    ``torch.autograd.profiler.profile(use_device="cuda")`` / ``use_cuda=True``."""
    kineto = torch.profiler.profiler._KinetoProfile
    original = kineto.__init__

    @functools.wraps(original)
    def __init__(self, *args, activities=None, **kwargs):
        original(self, *args, activities=translate_activities(target, activities), **kwargs)

    patcher.setattr(kineto, "__init__", __init__)
    device = own_device(target)

    def edit(values: dict) -> None:
        if values.pop("use_cuda", False):  # only where this torch still takes it
            warnings.warn("The attribute `use_cuda` will be deprecated soon, please use "
                          "``use_device = 'cuda'`` instead.", FutureWarning, stacklevel=3)
            values["use_device"] = "cuda"
        if values.get("use_device") == "cuda":
            values["use_device"] = device

    patcher.wrap_arguments(torch.autograd.profiler.profile, "__init__", edit)


@patch_function("profiler_ranges")
def patch_profiler_ranges(target: Target, patcher: Patcher) -> None:
    """``torch.autograd.profiler.emit_nvtx`` and ``torch.cuda.profiler``'s capture range."""
    patcher.setattr(torch.autograd.profiler, "emit_nvtx", _quiet_emit_nvtx_class())
    cuda_profiler = torch.cuda.profiler  # the real submodule: the facade passes submodules on
    patcher.setattr(cuda_profiler, "start", _no_capture_range)
    patcher.setattr(cuda_profiler, "stop", _no_capture_range)


def _no_capture_range() -> None:
    """``cudaProfilerStart`` / ``cudaProfilerStop`` without a CUDA device: no external CUDA
    profiler can be capturing, so there is no range to open or close."""


@functools.lru_cache(maxsize=None)
def _quiet_emit_nvtx_class() -> type:
    """``emit_nvtx`` where no NVTX tool can take ranges: a subclass of torch's (so
    ``isinstance`` holds) that keeps its arguments and contract and records nothing."""

    class emit_nvtx(torch.autograd.profiler.emit_nvtx):
        __doc__ = torch.autograd.profiler.emit_nvtx.__doc__

        def __enter__(self):
            if not self.enabled:
                return None
            if self.entered:
                raise RuntimeError("NVTX annotation context manager is not reentrant")
            self.entered = True
            torch.cuda.synchronize()
            return self

        def __exit__(self, exc_type, exc_val, exc_tb):
            if not self.enabled:
                return False
            torch.cuda.synchronize()
            return False

    emit_nvtx.__module__ = torch.autograd.profiler.emit_nvtx.__module__
    emit_nvtx.__qualname__ = torch.autograd.profiler.emit_nvtx.__qualname__
    return emit_nvtx
