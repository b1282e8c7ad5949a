"""Routes planned without running anything: which route each ATen operator would take on a
backend, from its native operator table (for ``ops`` and ``detect``).

The composite route is planned wherever a decomposition exists; at run time it is tried, and a
call whose decomposition reaches an operator the chip cannot run takes the CPU fallback.
"""
from __future__ import annotations

import os
from typing import Dict, FrozenSet, List, Mapping, Optional, Tuple

from ..aten import dispatcher, names
from ..aten.dtypes import dtype_names
from ..errors import BackendUnavailableError, FlagOSError
from . import composite, fallback, overrides, providers
from .gaps import resolve_gaps


def native_table(chip, environ: Mapping[str, str] = os.environ) -> FrozenSet[str]:
    """A chip's native overloads (loading its runtime if needed). Raises
    BackendUnavailableError when the chip is not here, ConfigError for bad chip options."""
    result = chip.probe(count_ops=False, query_tools=False)
    result.raise_if_misconfigured()
    if not result.available:
        raise BackendUnavailableError(chip.name, result.reason or "unavailable")
    return chip.native_ops(chip.options(environ))


def category_coverage(native: FrozenSet[str]) -> Tuple[List[str], List[str]]:
    """(categories a chip with these native overloads runs natively, the others)."""
    return names.category_coverage(native.__contains__)


def plan(chip, native: FrozenSet[str], environ: Mapping[str, str] = os.environ) -> List[Dict[str, str]]:
    """One row per overload that reaches the chip: ``{"op", "route", "detail"}``."""
    forced = overrides.from_env(environ)
    library = providers.library_for(chip) if chip.routes_operators else {}
    gaps = resolve_gaps(chip.dtype_gaps, native)
    rows = []
    for name in dispatcher.all_aten():
        if name not in native and not dispatcher.needs_backend_kernel(name):
            continue
        rows.append({"op": name, **_route(name, native, forced, library, gaps)})
    return rows


def _route(name: str, native, forced, library, gaps) -> Dict[str, str]:
    if name in forced:
        route, given, where = forced[name]
        return {"route": route, "detail": f"{where} sets {given}"}
    if name in native:
        if name in gaps:
            return {"route": "native", "detail": f"routed for {', '.join(dtype_names(gaps[name]))} (dtype gap)"}
        return {"route": "native", "detail": ""}
    if name in library:
        return {"route": "library", "detail": ", ".join(p for p, _ in library[name])}
    op = dispatcher.overload(name)
    found = composite.find(op)
    if found is not None:
        return {"route": "composite", "detail": found[1]}
    why = fallback.can_run(op)
    if why is None:
        return {"route": "fallback", "detail": "host round trip"}
    return {"route": "unsupported", "detail": why}


def category_summary(chip, available: bool) -> Optional[str]:
    """``"51/55"``: common categories a chip runs natively (None when it is not here)."""
    if not available:
        return None
    try:
        native = chip.native_ops(chip.options())
    except FlagOSError:
        return None
    yes, no = category_coverage(native)
    return f"{len(yes)}/{len(yes) + len(no)}"
