"""The ordered registry of redirection patches.

A patch is a small function ``fn(target, patcher)`` registered with :func:`patch_function`. It
changes torch only through the :class:`~flagos_torchfl.patching.Patcher` it is given, which records
what was there before, so that :meth:`Patcher.undo` puts back exactly the original objects, in
reverse order.

Patches run in registration order; the families register in the order ``redirect/__init__``
imports them. A patch of a module that ``import torch`` does not import declares it
(``waits_for="torch.distributed.fsdp"``): activation applies it at once when the program has
already imported that module, else :meth:`Patcher.when_imported` applies it the moment the
program's import of it has finished executing (an :class:`ImportHook` on ``sys.meta_path``).
Activation therefore imports nothing the program has not.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional

from ..patching import Patcher


@dataclasses.dataclass(frozen=True)
class Patch:
    """One named patch. ``on_cuda``: also needed when the backend *is* CUDA (NVIDIA or ROCm)
    but ``gpu_ids`` renumbers devices; otherwise a CUDA backend skips it. ``waits_for``: the
    module it patches, applied when the program imports it (None: applied at activation)."""

    name: str
    apply: Callable[[Any, "Patcher"], None]
    on_cuda: bool
    waits_for: Optional[str] = None


REGISTRY: List[Patch] = []


def patch_function(name: str, on_cuda: bool = False, waits_for: Optional[str] = None) -> Callable:
    """Register the decorated ``fn(target, patcher)`` as the next patch called ``name``.

    ``waits_for`` names the module (dotted, e.g. ``"torch.distributed.fsdp"``) the patch
    changes: the patch runs at activation if that module is already imported, otherwise when
    the program imports it; it may import nothing that module did not. Names are unique;
    registering a name twice, or a ``waits_for`` that is not a dotted module name, raises
    ValueError.
    """
    if waits_for is not None and not (isinstance(waits_for, str) and all(
            part.isidentifier() for part in waits_for.split("."))):
        raise ValueError(f"redirect patch {name!r}: waits_for must be a dotted module name, not {waits_for!r}")

    def register(fn: Callable[[Any, "Patcher"], None]) -> Callable[[Any, "Patcher"], None]:
        if any(p.name == name for p in REGISTRY):
            raise ValueError(f"redirect patch {name!r} is registered twice")
        REGISTRY.append(Patch(name, fn, on_cuda, waits_for))
        return fn

    return register
