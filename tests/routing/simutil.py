"""Start the sim with routing in an isolated test module: the backend and routing activation
steps, as ``ft.init_backend("sim")`` runs them (without the redirect layer, which these tests
do not need)."""
from __future__ import annotations

import os
from typing import Mapping, Optional

from tests.e2e.conformance.harness import small_native_ops


def start_sim(env: Optional[Mapping[str, str]] = None, backend: str = "sim"):
    """Set ``env``, install the sim and activate routing; returns (router, undo)."""
    from flagos_torchfl import routing
    from flagos_torchfl.machine import activation
    from flagos_torchfl.selection import build_selection

    os.environ.update(env or {})
    selection = build_selection(backend, {})
    activation.activate(selection.chip, selection)
    undo = routing.activate(selection)
    return routing.active_router(), undo


SMALL = ",".join(small_native_ops())


def decision(router, packet: str, dtype=None, training: bool = False):
    """The cached decision for any overload of ``aten::packet`` (the functional one, or the
    ``out=`` one a structured operator arrives as) for calls with ``dtype`` among their dtypes."""
    import torch

    dtype = dtype or torch.float32
    for name, dtypes, needs_grad, found in router.cached():
        if name.partition(".")[0] == f"aten::{packet}" and dtype in dtypes and needs_grad == training:
            return found
    return None
