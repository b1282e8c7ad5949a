"""Activation step of the backend itself: whatever the chip's runtime needs before use."""
from __future__ import annotations

from ..log import get_logger
from .registry import get_backend

log = get_logger("backends")


def activate(selection):
    """Let the selected backend prepare its runtime; returns its undo (or None). Warns about
    settings this version accepts and validates but does not apply on that backend yet."""
    backend = get_backend(selection.backend)
    unapplied = unapplied_settings(backend, selection.settings)
    if unapplied:
        log.warning("accepted but not applied on backend %s in this version: %s",
                    backend.name, ", ".join(unapplied))
    return backend.activate(selection)


def unapplied_settings(backend, settings) -> list:
    """The settings given in ``settings`` that ``backend`` does not act on yet."""
    names = []
    if settings.memory_virtual_limit is not None and not backend.enforces_memory_limit:
        names.append(f"memory_virtual_limit={settings.memory_virtual_limit}")
    if settings.memory_pool_clear_interval is not None:
        names.append(f"memory_pool_clear_interval={settings.memory_pool_clear_interval}")
    if settings.enable_mixed_precision:
        names.append("enable_mixed_precision=True")
    return names
