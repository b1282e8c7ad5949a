"""HF accelerate's device question answered for the backend.

From 1.16 on, accelerate decides the device, the collective and the distributed type of a run
with one function, ``get_torch_accelerator_backend()``: it asks ``torch.accelerator`` (truthful
under activation) for the accelerator and knows accelerators by name (``cuda``, ``mps``,
``npu``, ``mlu``, ``musa``, ...), answering with their own device modules. Where it names one of
those (a chip's own plugin: torch_npu's ``npu``), its answer stands. Where it finds none (the
cpu backend presents no accelerator there; a sim profile's ``npu`` has no torch_npu behind it)
or only one it does not know (the sim's device type, answered with the generic
``torch.accelerator``, which has no collective in its table), accelerate would run every rank of
``accelerate launch --multi_gpu`` as a separate single-process program, each training alone.
There the ``accelerate_device`` patch answers
``("cuda", torch.cuda)``: the facade, which is what accelerate up to 1.15 concluded by asking
``torch.cuda.is_available()`` after its vendor checks. Older accelerate has no such function and
is left alone.
"""
from __future__ import annotations

import functools
import sys

import torch

from .accelerator import not_asked_by_the_program
from .devices import Target
from ..patching import Patcher
from .patches import patch_function

_QUESTION = "get_torch_accelerator_backend"


@patch_function("accelerate_device", waits_for="accelerate.utils.imports")
def patch_accelerate_device(target: Target, patcher: Patcher) -> None:
    """accelerate's ``get_torch_accelerator_backend()`` names ``cuda`` (the facade) where its own
    answer is no device or one it does not know by name; in ``accelerate.utils.imports`` and
    every accelerate module already holding the function by name."""
    imports = sys.modules["accelerate.utils.imports"]
    original = getattr(imports, _QUESTION, None)
    if original is None:
        return

    @functools.wraps(original)
    def get_torch_accelerator_backend(*args, **kwargs):
        with not_asked_by_the_program:
            device_type, module = original(*args, **kwargs)
        if device_type is None or module is getattr(torch, "accelerator", None):
            return "cuda", torch.cuda
        return device_type, module

    owners = [module for name, module in list(sys.modules.items())
              if name == "accelerate" or name.startswith("accelerate.")]
    patcher.replace_in(owners, _QUESTION, original, get_torch_accelerator_backend)
