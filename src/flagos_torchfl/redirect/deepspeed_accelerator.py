"""DeepSpeed's accelerator answered by the selected backend.

DeepSpeed asks one accelerator object (``deepspeed.accelerator.get_accelerator()``) for the
device name, device count and current device, memory statistics, RNG, streams and events,
the collective's name, pinned memory and dtypes. It picks that object itself by importing
vendor plugins (``torch_npu`` → its ``npu`` accelerator, ``torch_mlu`` → ``mlu``, ...), and
otherwise takes CUDA when ``torch.cuda.is_available()`` and else the CPU. Where DeepSpeed has
no accelerator of its own for the backend (``Backend.provides_deepspeed_accelerator``: the cpu
backend with its logical devices, the sim and its profiles), the ``deepspeed_accelerator``
patch installs :func:`make_accelerator`'s object through DeepSpeed's ``set_accelerator`` as
soon as ``deepspeed.accelerator`` has been imported, before DeepSpeed asks for one; undo puts
DeepSpeed's previous choice back. A ``DS_ACCELERATOR`` set by the user is left to DeepSpeed.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

from .cuda_api import active_facade
from .devices import Target
from ..patching import Patcher
from .patches import patch_function


@patch_function("deepspeed_accelerator", waits_for="deepspeed.accelerator")
def patch_deepspeed_accelerator(target: Target, patcher: Patcher) -> None:
    """``deepspeed.accelerator.get_accelerator()`` answers for the backend where DeepSpeed has
    no accelerator of its own for it; elsewhere (and under ``DS_ACCELERATOR``) DeepSpeed keeps
    its own choice."""
    if not target.chip.provides_deepspeed_accelerator or "DS_ACCELERATOR" in os.environ:
        return
    real = importlib.import_module("deepspeed.accelerator.real_accelerator")
    accelerator = make_accelerator(target)
    patcher.setattr(real, "ds_accelerator", real.ds_accelerator)
    real.set_accelerator(accelerator)


def make_accelerator(target: Target) -> Any:
    """A DeepSpeed accelerator answering every device question for ``target``
    (:class:`~.deepspeed_accelerator_class.BackendAccelerator`; its module imports DeepSpeed, so it is
    imported only once DeepSpeed's accelerator package has been)."""
    from .deepspeed_accelerator_class import BackendAccelerator

    return BackendAccelerator(target, active_facade())
