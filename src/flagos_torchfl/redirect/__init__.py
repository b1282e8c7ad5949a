"""Interface adaptation: CUDA-written code answered by the selected backend.

:func:`activate` applies the registered patches (see :mod:`.patches`) in order and returns the
undo that restores torch exactly. Each patch replaces, once, an entry point where user code
names a device — never an operator: there is no TorchFunctionMode or dispatch mode, so the
operator path costs nothing extra. When the backend *is* CUDA (NVIDIA or ROCm) nothing is
patched, unless ``gpu_ids`` renumbers devices; then only the patches that carry device
numbers are applied.

The patch families (:data:`FAMILIES`) register their patches as they are imported, in that
order, which is the order of application (``docs/design.md`` has the table).
"""
from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, List, Optional, Tuple

from ..errors import ActivationError
from ..log import get_logger
from . import factories
from .devices import DeviceOrdinalError, Target
from ..patching import Patcher
from .patches import REGISTRY, Patch
from .shims import find_shim, refuse_if_shimmed
from ..selection_view import SelectionView

__all__ = [
    "activate", "apply", "active_patches", "waiting_patches", "patches_for", "DeviceOrdinalError", "Target",
    "find_shim", "REGISTRY",
]

#: the modules that register patches, in the order activation applies them: each family's
#: patches are applied after those of the families before it
FAMILIES = (
    "devices", "factories", "tensor_module", "cuda_api", "amp", "compiling", "profiler", "distributed",
    "clean_exit", "serialization", "accelerator", "hf_accelerate", "deepspeed_accelerator", "cuda_key",
    "data_parallel", "attention",
)
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")

log = get_logger("redirect")
_lock = threading.RLock()
_active: Optional[Tuple[Tuple[Any, ...], Patcher, List[str], List[str]]] = None


def patches_for(target: Target) -> List[Patch]:
    """The registered patches ``target`` needs, in order: all of them off CUDA; on a CUDA
    backend none, or (when ``gpu_ids`` renumbers devices) those that carry device numbers."""
    if not target.cuda_itself:
        return list(REGISTRY)
    return [p for p in REGISTRY if p.on_cuda] if target.remaps else []


def active_patches() -> List[str]:
    """Names of the patches now applied, in the order they were (empty when the layer is
    inactive); see :func:`waiting_patches` for those not yet applied."""
    with _lock:
        return list(_active[2]) if _active else []


def activate(selection: SelectionView) -> Callable[[], None]:
    """Activation step: redirect CUDA entry points to ``selection``'s backend; returns the undo.

    Idempotent and thread-safe: activating again for the same backend and devices changes
    nothing (and returns an undo that does nothing); for a different one it raises
    ActivationError. If a vendor migration shim has patched torch, or any patch fails, it
    raises ActivationError and torch is left exactly as it was.
    """
    return apply(Target.from_selection(selection))


def apply(target: Target) -> Callable[[], None]:
    """Apply the patches for ``target`` (see :func:`activate`); returns the undo."""
    global _active
    with _lock:
        key = (target.chip_name, target.device_type, target.devices)
        if _active is not None:
            if _active[0] == key:
                return _nothing
            raise ActivationError(
                f"the redirection is already active for backend {_active[0][0]!r}; "
                f"call ft.deactivate() before activating {target.chip_name!r}"
            )
        refuse_if_shimmed()
        factories.device_constructors()  # torch caches its list: read it before any patch
        patcher = Patcher()
        applied: List[str] = []
        waiting: List[str] = []
        for patch in patches_for(target):
            try:
                _apply_one(patch, target, patcher, applied, waiting)
            except BaseException as exc:
                patcher.undo()
                raise ActivationError(
                    f"redirect patch {patch.name!r} failed ({type(exc).__name__}: {exc}); "
                    "nothing was changed"
                ) from exc
        _active = (key, patcher, applied, waiting)
        if applied or waiting:
            log.info("redirect active for %s: %s; applied when their module is imported: %s",
                     target.chip_name, ", ".join(applied), ", ".join(waiting) or "none")
        else:
            log.info("redirect: backend %s is CUDA itself; nothing to redirect", target.chip_name)

        def undo() -> None:
            _undo(patcher)

        return undo


def _apply_one(patch: Patch, target: Target, patcher: Patcher, applied: List[str], waiting: List[str]) -> None:
    """Apply ``patch`` now, or (``waits_for``) once the program has imported its module: then
    its name moves from ``waiting`` to ``applied``."""
    def run(module: Any = None) -> None:
        if patch.name in waiting:
            waiting.remove(patch.name)
        patch.apply(target, patcher)
        applied.append(patch.name)

    if patch.waits_for is None:
        run()
    elif not patcher.when_imported(patch.waits_for, run, patch.name):
        waiting.append(patch.name)


def waiting_patches() -> List[str]:
    """Names of the patches that wait for the program to import their module (empty when the
    layer is inactive)."""
    with _lock:
        return list(_active[3]) if _active else []


def _undo(patcher: Patcher) -> None:
    """Restore torch if ``patcher`` holds the active patches (a second call does nothing)."""
    global _active
    with _lock:
        if _active is not None and _active[1] is patcher:
            try:
                patcher.undo()
            finally:
                _active = None
            log.info("redirect undone")


def _nothing() -> None:
    """The undo of an activation that changed nothing."""
