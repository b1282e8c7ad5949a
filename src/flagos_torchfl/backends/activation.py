"""Activation step of the backend itself: whatever the chip's runtime needs before use."""
from __future__ import annotations

from .registry import get_backend


def activate(selection):
    """Let the selected backend prepare its runtime; returns its undo (or None)."""
    return get_backend(selection.backend).activate(selection)
