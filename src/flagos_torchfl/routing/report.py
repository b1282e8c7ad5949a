"""What routing did: per operator, its route, calls, total time and host bytes copied; and the
host bytes a chip's collectives staged (the sim's, whose collectives run gloo on host copies).

``routing_report()`` returns the rows, most expensive first; ``render()`` formats them (the
launcher's ``run --report`` prints it at exit). Times include everything the route ran, so an
operator decomposed into other routed operators counts their time too.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional

from ..config import format_bytes
from .state import active_router, current_verdict


class _Row:
    __slots__ = ("routes", "dtypes", "misses")

    def __init__(self):
        #: route -> [calls, nanoseconds, host bytes]
        self.routes: Dict[str, List[int]] = {}
        self.dtypes = 0
        self.misses = 0


class Stats:
    """Per-operator counters, updated by the router on every routed call."""

    def __init__(self):
        self._rows: Dict[str, _Row] = {}
        self._lock = threading.Lock()
        #: route -> [calls, nanoseconds, host bytes] of the calls not made inside another route
        self.top: Dict[str, List[int]] = {}

    def record(self, name: str, route: str, dtype_mask: int, ns: int, host_bytes: int,
               nested: bool = False) -> None:
        """Count one call of ``name`` by ``route``; ``nested``: made inside another routed call
        (a part of a decomposition), whose time includes it."""
        with self._lock:
            if not nested:
                top = self.top.setdefault(route, [0, 0, 0])
                top[0] += 1
                top[1] += ns
                top[2] += host_bytes
            row = self._rows.get(name)
            if row is None:
                row = self._rows[name] = _Row()
            counts = row.routes.get(route)
            if counts is None:
                counts = row.routes[route] = [0, 0, 0]
            counts[0] += 1
            counts[1] += ns
            counts[2] += host_bytes
            row.dtypes |= dtype_mask

    def miss(self, name: str) -> None:
        """A cached composite decision could not serve one call (it took the fallback)."""
        with self._lock:
            row = self._rows.get(name)
            if row is None:
                row = self._rows[name] = _Row()
            row.misses += 1

    def rows(self) -> List[dict]:
        """One dict per operator, most total time first. ``routes``: route -> {calls, ms,
        host_bytes} (an operator takes several routes when its calls differ in dtype or mode,
        or when an override changed)."""
        from ..aten import names
        from ..aten.dtypes import dtype_names

        with self._lock:
            items = [(name, {r: list(c) for r, c in row.routes.items()}, row.dtypes, row.misses)
                     for name, row in self._rows.items()]
        out = []
        for name, routes, dtypes, misses in items:
            out.append({
                "op": name,
                "route": "+".join(sorted(routes)) or "fallback",
                "routes": {r: {"calls": c, "ms": ns / 1e6, "host_bytes": b} for r, (c, ns, b) in routes.items()},
                "calls": sum(c for c, _, _ in routes.values()),
                "total_ms": sum(ns for _, ns, _ in routes.values()) / 1e6,
                "host_bytes": sum(b for _, _, b in routes.values()),
                "dtypes": dtype_names(dtypes),
                "categories": names.categories_of(name),
                "composite_misses": misses,
            })
        out.sort(key=lambda r: (-r["total_ms"], r["op"]))
        return out

    def totals(self) -> Dict[str, tuple]:
        """Route -> (calls, nanoseconds, host bytes) of the calls not made inside another route."""
        with self._lock:
            return {route: tuple(counts) for route, counts in self.top.items()}

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self.top.clear()


#: the ``op`` of the row that counts collectives staged through host memory
COLLECTIVES_ROW = "c10d collectives"


def collectives_row(staging: Optional[Dict[str, int]]) -> Optional[dict]:
    """The report row of the collectives a chip staged through host memory (route
    ``host-staging``, no time measured), or None when it staged none."""
    if not staging or not staging.get("collectives"):
        return None
    calls = staging["collectives"]
    moved = staging["to_host_bytes"] + staging["to_device_bytes"]
    return {
        "op": COLLECTIVES_ROW, "route": "host-staging",
        "routes": {"host-staging": {"calls": calls, "ms": 0.0, "host_bytes": moved}},
        "calls": calls, "total_ms": 0.0, "host_bytes": moved, "dtypes": [],
        "categories": ["collective"], "composite_misses": 0,
        "to_host_bytes": staging["to_host_bytes"], "to_device_bytes": staging["to_device_bytes"],
    }


def routing_report() -> List[dict]:
    """Per routed operator: route, calls, total time (ms), host bytes copied, dtypes seen and
    semantic categories — most expensive first; then, on a chip whose collectives stage
    through host memory, one row ``op == COLLECTIVES_ROW`` with the collectives staged and
    the bytes they copied (also split into ``to_host_bytes`` / ``to_device_bytes``). Empty
    when routing is not active or nothing was routed or staged."""
    router = active_router()
    if router is None:
        return []
    rows = router.stats.rows()
    staging = router.policy.collective_staging
    row = collectives_row(staging() if staging is not None else None)
    return rows + [row] if row is not None else rows


def render(rows: Optional[List[dict]] = None) -> str:
    """The report as a text table (with a one-line summary per route), ending with the verdict
    (:mod:`.verdict`) while routing is active."""
    text = _table(active_router(), rows)
    data = current_verdict()
    if data is None:
        return text
    from .verdict import render as render_verdict

    return text + "\n\n" + render_verdict(data)


def render_json() -> str:
    """The verdict as one JSON document (``run --report --json``); ``{"routing": null}`` when
    routing is not active."""
    import json

    data = current_verdict()
    return json.dumps(data if data is not None else {"routing": None}, indent=1)


def _table(router, rows: Optional[List[dict]]) -> str:
    if rows is None:
        rows = routing_report()
    if router is None and not rows:
        return "routing report: routing is not active"
    head = "routing report"
    if router is not None:
        policy = router.policy
        how = "backend fallback" if router.uses_fallback else "per-operator kernels"
        head += (f" for {policy.chip_name} ({policy.dispatch_key}, {len(policy.native)} native operators, "
                 f"{how}, {len(router.registered)} per-operator kernels)")
    staged = [r for r in rows if r["op"] == COLLECTIVES_ROW]
    rows = [r for r in rows if r["op"] != COLLECTIVES_ROW]
    tail = [f"collectives staged through host memory: {r['calls']} calls, "
            f"{format_bytes(r['to_host_bytes'])} to host, {format_bytes(r['to_device_bytes'])} back"
            for r in staged]
    if not rows:
        return "\n".join([head + ": no operator needed a route"] + tail)
    table = [("OPERATOR", "ROUTE", "CALLS", "TOTAL MS", "HOST BYTES", "DTYPES")]
    for r in rows:
        table.append((r["op"], r["route"], str(r["calls"]), f"{r['total_ms']:.2f}",
                      format_bytes(r["host_bytes"]) if r["host_bytes"] else "0",
                      ",".join(r["dtypes"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [head]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    totals: Dict[str, List[float]] = {}
    for r in rows:
        for route, counts in r["routes"].items():
            t = totals.setdefault(route, [0, 0.0, 0])
            t[0] += counts["calls"]
            t[1] += counts["ms"]
            t[2] += counts["host_bytes"]
    summary = "; ".join(f"{route}: {int(c)} calls, {ms:.1f} ms, {format_bytes(int(b)) if b else '0 B'} copied"
                        for route, (c, ms, b) in sorted(totals.items()))
    lines.append(f"total by route: {summary}")
    return "\n".join(lines + tail)
