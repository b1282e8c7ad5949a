"""Activating a chip: its variables set before its runtime reads them, its vendor plugin
imported and checked, then what its :class:`~flagos_torchfl.backends.base.Backend` needs at start (``start``). Each
step's undo is kept; a failure undoes what was done."""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from . import environment as _environment
from . import bounded_calls as _calls
from . import visible as _visible
from .probing import Unavailable
from ..selection_view import SelectionView


def activate(chip: Any, selection: SelectionView) -> Optional[Callable[[], None]]:
    """Prepare ``chip``'s runtime for ``selection``; return an undo callable or None. Warns once
    when the vendor plugin's version is outside the tested ones."""
    # the chip's variables (device mask, NVIDIA's counterparts) before its runtime reads them
    undo_environ = chain(_visible.translate(chip.visible_devices_env if chip.plugin_found() else None),
                         _environment.translate(chip.cuda_environment()))
    try:
        if chip.plugin_module:
            import_plugin(chip)
            from ..compat import check_plugin

            check_plugin(chip.plugin_module, chip.plugin_version(), chip.tested_plugin_versions)
        undo_start = chip.start(selection)
    except BaseException:
        if undo_environ is not None:
            undo_environ()
        raise
    return chain(undo_start, undo_environ)


def import_plugin(chip: Any) -> None:
    """Import ``chip``'s vendor plugin if no probe of this process has (a child reusing its
    parent's probe); BackendUnavailableError when it cannot be imported."""
    if chip.plugin_module in sys.modules:
        return
    try:
        chip.load_runtime(_calls.probe_timeout())
    except Unavailable as exc:
        from ..errors import BackendUnavailableError

        raise BackendUnavailableError(chip.name, exc.reason) from None


def chain(*undos: Optional[Callable[[], None]]) -> Optional[Callable[[], None]]:
    """One undo running ``undos`` (None ones skipped) in the order given."""
    steps = [u for u in undos if u is not None]
    if not steps:
        return None

    def undo() -> None:
        for step in steps:
            step()

    return undo
