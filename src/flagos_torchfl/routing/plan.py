"""Routes planned without running anything: which route each ATen operator would take on a
backend, from its native operator table (for ``ops`` and ``detect``).

The composite route is planned wherever a decomposition exists; at run time it is tried, and a
call whose decomposition reaches an operator the chip cannot run takes the CPU fallback.
"""
from __future__ import annotations

import os
from typing import Dict, FrozenSet, List, Mapping, Optional, Tuple

from ..errors import BackendUnavailableError, FlagOSError
from . import composite, coverage, fallback, names, overrides, providers, schema
from .gaps import resolve_gaps


def sim_native(environ: Mapping[str, str] = os.environ) -> FrozenSet[str]:
    """The sim's native set as ``FL_SIM_NATIVE_OPS`` (or the default) describes it, without
    installing the sim."""
    from .. import sim
    from ..sim.native_ops import runtime_primitive_names

    spec = environ.get("FL_SIM_NATIVE_OPS", "").strip()
    if not spec:
        return sim.default_native_ops()
    return frozenset(sim.parse_native_ops(spec, resolve_name=names.resolve_semantic)) | runtime_primitive_names()


def native_table(backend, environ: Mapping[str, str] = os.environ) -> FrozenSet[str]:
    """A backend's native overloads: the dispatcher's table once its runtime is loaded (the
    sim: its configured set). Raises BackendUnavailableError when the chip is not here."""
    if backend.name == "sim":
        from .. import sim

        return sim.native_op_names() if sim.is_installed() else sim_native(environ)
    result = backend.probe(count_ops=False)
    if not result.available:
        raise BackendUnavailableError(backend.name, result.reason or "unavailable")
    return coverage.native_set(backend.dispatch_key)


def category_coverage(native: FrozenSet[str]) -> Tuple[List[str], List[str]]:
    """(categories a chip with these native overloads runs natively, the others)."""
    return names.category_coverage(native.__contains__)


def plan(backend, native: FrozenSet[str], environ: Mapping[str, str] = os.environ) -> List[Dict[str, str]]:
    """One row per overload that reaches the backend: ``{"op", "route", "detail"}``."""
    forced = overrides.from_env(environ)
    library = providers.library_for(backend) if backend.dispatch_key != "CPU" else {}
    gaps = resolve_gaps(backend.dtype_gaps, native)
    rows = []
    for name in coverage.all_aten():
        if name not in native and not coverage.needs_backend_kernel(name):
            continue
        rows.append({"op": name, **_route(name, native, forced, library, gaps)})
    return rows


def _route(name: str, native, forced, library, gaps) -> Dict[str, str]:
    if name in forced:
        route, given, where = forced[name]
        return {"route": route, "detail": f"{where} sets {given}"}
    if name in native:
        if name in gaps:
            from .router import dtypes_of

            lacking = ", ".join(str(d).replace("torch.", "") for d in dtypes_of(gaps[name]))
            return {"route": "native", "detail": f"routed for {lacking} (dtype gap)"}
        return {"route": "native", "detail": ""}
    if name in library:
        return {"route": "library", "detail": ", ".join(p for p, _ in library[name])}
    op = schema.overload(name)
    found = composite.find(op)
    if found is not None:
        return {"route": "composite", "detail": found[1]}
    why = fallback.can_run(op)
    if why is None:
        return {"route": "fallback", "detail": "host round trip"}
    return {"route": "unsupported", "detail": why}


def category_summary(backend, available: bool) -> Optional[str]:
    """``"51/55"``: common categories a backend runs natively (None when it is not here)."""
    if not available:
        return None
    try:
        native = sim_native() if backend.name == "sim" else coverage.native_set(backend.dispatch_key)
    except FlagOSError:
        return None
    yes, no = category_coverage(native)
    return f"{len(yes)}/{len(yes) + len(no)}"
