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
    """(categories a chip with these native overloads runs natively, the others). A structured
    operator's functional and in-place overloads run natively where its ``out=`` one does."""
    return names.category_coverage(lambda name: name in native or dispatcher.out_delegate(name) in native)


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


def compare(a: str, a_ops: FrozenSet[str], b: str, b_ops: FrozenSet[str]) -> dict:
    """What a model loses and gains moving from chip ``a`` to chip ``b`` (their native
    overloads): the categories native on one only, each with the checks the other fails, and the
    overloads that reach a backend and only one chip runs, by category (``other``: in none)."""
    a_yes, _ = category_coverage(a_ops)
    b_yes, _ = category_coverage(b_ops)

    def runner(have: FrozenSet[str]):
        return lambda o: o in have or dispatcher.out_delegate(o) in have

    def missing(category: str, runs) -> List[str]:
        return [entry for entry in names.categories()[category]["check"]
                if not any(runs(o) for alt in entry.split("|") for o in names.aten_overloads(alt))]

    def by_category(ops: List[str]) -> Dict[str, List[str]]:
        grouped: Dict[str, List[str]] = {}
        for op in sorted(ops):
            for category in names.categories_of(op) or ["other"]:
                grouped.setdefault(category, []).append(op)
        return dict(sorted(grouped.items(), key=lambda item: (item[0] == "other", -len(item[1]), item[0])))

    a_runs, b_runs = runner(a_ops), runner(b_ops)
    a_reach = [n for n in a_ops if dispatcher.needs_backend_kernel(n)]
    b_reach = [n for n in b_ops if dispatcher.needs_backend_kernel(n)]
    total = len(names.categories())
    return {
        "from": {"name": a, "operators": len(a_reach), "categories": f"{len(a_yes)}/{total}"},
        "to": {"name": b, "operators": len(b_reach), "categories": f"{len(b_yes)}/{total}"},
        "categories_lost": {c: missing(c, b_runs) for c in a_yes if c not in b_yes},
        "categories_gained": {c: missing(c, a_runs) for c in b_yes if c not in a_yes},
        "operators_lost": by_category([n for n in a_reach if not b_runs(n)]),
        "operators_gained": by_category([n for n in b_reach if not a_runs(n)]),
    }
