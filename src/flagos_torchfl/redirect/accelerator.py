"""Where torch asks which accelerator it runs on.

``torch.accelerator`` stays truthful: it reports the real backend, and on the CPU backend no
accelerator at all. Presenting host devices through it is not safe: its Python answers would
disagree with its C++ side (``at::accelerator``), which cannot be changed from Python, and
torch's own users call both — with ``torch.accelerator.is_available()`` answering True on a
CPU-only build, ``DataLoader(pin_memory=True)`` and ``torch.compile`` of a function without
tensor inputs fail with "Cannot access accelerator device when none is available".

Three patches:

* ``accelerator_asks_real_cuda``: on a CUDA build of torch ``torch.accelerator.is_available()``
  and ``device_count()`` ask ``torch.get_device_module("cuda")``, which is the facade; they are
  wrapped so that the facade gives them the real module's answers
  (:func:`.cuda_facade.asked_by_torch_accelerator`): False and 0 without a GPU, the physical
  count under ``gpu_ids``.

* ``available_device_type``: ``torch._utils._get_available_device_type()`` (DCP's file writer,
  ``DataParallel``) asks ``torch.cuda.is_available()`` first, which the facade answers True,
  and would then move the chip's tensors as if they were CUDA tensors. It answers the real
  accelerator's type instead; where there is none (the CPU backend) torch's own answer stands
  (``"cuda"``: the facade, whose streams run inline on the host).
* ``accelerator_hint``: where the backend presents no accelerator, a program that asked
  ``torch.accelerator`` for one (``device_count()``, ``is_available()``,
  ``current_accelerator()``) and was told there is none gets, when it ends, one line on stderr
  saying why and which backend runs it. (On a build for an accelerator this machine lacks, a
  CUDA build without a driver, torch's ``device_count()`` delegates to ``torch.cuda``: the
  facade gives it the real count, 0.)
"""
from __future__ import annotations

import atexit
import functools
import sys
from typing import Any, Optional

import torch

from .. import compat
from .cuda_facade import ThreadDepth, asked_by_torch_accelerator
from .devices import Target
from ..patching import Patcher
from .patches import patch_function

_ASKED = ("device_count", "is_available", "current_accelerator")
#: set while the hint patch is active: {"backend": name} and, once asked, {"asked": True}
_watch: dict = {}
#: inside it, this thread's questions to ``torch.accelerator`` are the package's own, asked on a
#: library's behalf to answer it (as for accelerate): finding none there is no hint
not_asked_by_the_program = ThreadDepth()


def _real_accelerator_type() -> Optional[str]:
    """The type of the accelerator present (None without one: a CUDA build of torch on a machine
    without a GPU has none, though it was compiled for one)."""
    accelerator = compat.accelerator_module()
    if accelerator is None:
        return None
    found = (accelerator.current_accelerator(check_available=True)
             if compat.has("accelerator_check_available") else accelerator.current_accelerator())
    return found.type if found is not None else None


@patch_function("accelerator_asks_real_cuda", on_cuda=True)
def patch_accelerator_asks_real_cuda(target: Target, patcher: Patcher) -> None:
    """Where torch's accelerator is CUDA (the build's, GPU or not), ``torch.accelerator``'s
    questions to ``torch.cuda`` get the real module's answers, not the facade's."""
    accelerator = compat.accelerator_module()
    built_for = accelerator.current_accelerator() if accelerator is not None else None
    if built_for is None or built_for.type != "cuda":
        return
    for name in ("is_available", "device_count"):
        original = getattr(accelerator, name)

        def make(original=original):
            @functools.wraps(original)
            def truthful(*args, **kwargs):
                with asked_by_torch_accelerator:
                    return original(*args, **kwargs)

            return truthful

        patcher.setattr(accelerator, name, make())


@patch_function("available_device_type")
def patch_available_device_type(target: Target, patcher: Patcher) -> None:
    """``torch._utils._get_available_device_type``, and the modules already imported that took
    it by name (one imported later takes the patched function)."""
    import torch._utils as utils

    original = utils._get_available_device_type

    @functools.wraps(original)
    def _get_available_device_type() -> Optional[str]:
        found = _real_accelerator_type()
        return found if found is not None else original()

    owners = [utils] + [sys.modules.get(name) for name in
                        ("torch.nn.parallel.data_parallel", "torch.distributed.checkpoint.filesystem")]
    patcher.replace_in(owners, "_get_available_device_type", original, _get_available_device_type)


def _none_found(name: str, value: Any) -> bool:
    return (name == "device_count" and value == 0) or (name != "device_count" and not value)


def _from_program(depth: int = 2) -> bool:
    """Whether the caller ``depth`` frames up is the program's code, not torch's own nor this
    package's, nor asked inside :data:`not_asked_by_the_program`."""
    if not_asked_by_the_program.depth:
        return False
    caller = sys._getframe(depth).f_globals.get("__name__", "")
    return caller.partition(".")[0] not in ("torch", "flagos_torchfl")


@patch_function("accelerator_hint")
def patch_accelerator_hint(target: Target, patcher: Patcher) -> None:
    """On a backend that presents no accelerator, note when the program finds none."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or _real_accelerator_type() is not None:
        return
    patcher.setitem(_watch, "backend", target.chip_name)
    for name in _ASKED:
        original = getattr(accelerator, name, None)
        if original is None:
            continue

        def make(original=original, name=name):
            @functools.wraps(original)
            def asked(*args, **kwargs):
                value = original(*args, **kwargs)
                if "backend" in _watch and _none_found(name, value) and _from_program():
                    _watch["asked"] = True
                return value

            return asked

        patcher.setattr(accelerator, name, make())


def hint() -> Optional[str]:
    """The line printed at exit, or None when the program did not find itself without one."""
    if not _watch.get("asked") or "backend" not in _watch:
        return None
    return (f"flagos_torchfl: the program asked torch.accelerator for a device and found none: "
            f"backend {_watch['backend']!r} presents no accelerator there (torch.accelerator stays "
            f"truthful; torch.cuda answers for it); run it with FL_BACKEND=sim to train on a "
            f"simulated accelerator")


@atexit.register
def _print_hint() -> None:
    line = hint()
    if line is not None:
        print(line, file=sys.stderr)
