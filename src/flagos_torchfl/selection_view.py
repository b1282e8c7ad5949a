"""What the layers below :mod:`.selection` read of the activation's decision.

The chips (``backends/``), the layers over them (``redirect/``, ``routing/``) and the settings
applied at activation (``precision/``, ``memory.py``, ``checkpoint.py``) are handed the
:class:`~.selection.Selection` but may not import it: it sits above them. They read it as a
:class:`SelectionView`, whose members are all they may read; the layer tests check both that a
``Selection`` is one and that no module below reads anything else of it.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol, Tuple, runtime_checkable

from .config import Settings


@runtime_checkable
class SelectionView(Protocol):
    """A decision as the layers below it read it."""

    #: the backend asked for, by name (``"sim"`` under a sim profile too)
    backend: str
    #: the ``Backend`` that answers for it (``backends/base.py``; typed loosely, being a layer up)
    chip: Any
    #: the physical device of each logical one: ``cuda:i`` is ``devices[i]``
    devices: Tuple[int, ...]
    settings: Settings
    #: the chip's own inputs (``Backend.options``)
    options: Mapping[str, Any]
    #: the routing inputs (``routing.config.RoutingConfig``), or None
    routing: Any
    #: operators that run in float32 under autocast
    fp32_ops: Tuple[str, ...]
    check_finite: bool
    #: what probing found (``backends.base.ProbeResult``), or None
    probe: Any

    @property
    def device_type(self) -> str:
        """The chip's device type."""

    def device_memory(self, logical: int) -> Optional[int]:
        """Total memory of a logical device as probing saw it (None: unknown)."""

    def memory_limit_bytes(self, logical: int = 0) -> Optional[int]:
        """The memory limit of a logical device in bytes (None: no limit)."""
