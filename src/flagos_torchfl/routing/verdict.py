"""The verdict of a run: how its operator calls ran on the chip — native, library, composite,
fallback, unsupported — with calls, share of operator time and host bytes per optimizer step, and
the operators that would cost the most on the chip first.

A :class:`Census` counts what the router does not see: native calls (on a chip that can time them
from the host, such as the sim; elsewhere the share is of the run's wall time) and optimizer steps.
Work done inside a route (a decomposition's parts, a fallback's copies) counts as the route's.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

from .. import optimizer_steps
from ..config import format_bytes
from .budget import format_share

ROUTES = ("native", "library", "composite", "fallback", "unsupported")
#: order of the costliest first: what fails, then host round trips, then decompositions
_SEVERITY = {"unsupported": 0, "fallback": 1, "composite": 2, "library": 3}


class Census:
    """Native calls (when ``chip`` can time them) and optimizer steps, from :meth:`start` on."""

    def __init__(self, router, chip):
        self.router = router
        self.chip = chip
        #: the chip's count of native calls made outside any route (None: it cannot time them)
        self.native = None
        self.native_timed = False
        self.steps = 0
        #: called after each optimizer step (the strict fallback budget)
        self.on_step: Optional[Callable[[], None]] = None
        self.started = time.perf_counter_ns()
        self._undo: List[Callable[[], None]] = []

    def start(self) -> Callable[[], None]:
        """Begin counting; returns :meth:`stop`."""
        native = self.chip.count_native_calls()
        if native is not None:
            self.native, self.native_timed = native, True
            self.router.pause_native = native.pause
            self._undo.append(self._stop_native)
        self._undo.append(optimizer_steps.after_each_step(self._step))
        return self.stop

    def stop(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _stop_native(self) -> None:
        self.router.pause_native = None
        self.native.stop()

    def _step(self, *_args) -> None:
        self.steps += 1
        if self.on_step is not None:
            self.on_step()

    def native_rows(self) -> Dict[str, List[int]]:
        """``{overload: [calls, nanoseconds]}`` of the native calls counted (empty when the chip
        cannot time them)."""
        return {} if self.native is None else self.native.rows()


def verdict(router, census: Census) -> dict:
    """The run so far as a dict (``--json`` prints it): ``routes`` (route -> operators, calls,
    ms, share, host bytes, and the same per step), ``operators`` (every routed operator, costliest
    first), ``steps``, ``time_basis`` and what the chip is."""
    described = census.chip.describe()
    native = census.native_rows()
    rows = router.stats.rows()
    top = router.stats.totals()
    native_ns = sum(ns for _, ns in native.values())
    if census.native_timed:
        basis, basis_ns = "operator time", native_ns + sum(ns for _, ns, _ in top.values())
    else:
        basis, basis_ns = "wall time", time.perf_counter_ns() - census.started
    steps = census.steps

    def share(ns: float) -> Optional[float]:
        return ns / basis_ns if basis_ns else None

    def entry(operators: int, calls: int, ns: int, nbytes: int) -> dict:
        out = {"operators": operators, "calls": calls, "ms": ns / 1e6, "share": share(ns), "host_bytes": nbytes}
        if steps:
            out.update(calls_per_step=calls / steps, host_bytes_per_step=nbytes / steps)
        return out

    routes = {"native": entry(len(native), sum(c for c, _ in native.values()), native_ns, 0)}
    if not census.native_timed:
        routes["native"].update(operators=None, calls=None, ms=None, share=None)
    for route in ROUTES[1:]:
        calls, ns, nbytes = top.get(route, (0, 0, 0))
        routes[route] = entry(sum(route in r["routes"] for r in rows), calls, ns, nbytes)
    operators = []
    for r in rows:
        worst = min(r["routes"], key=lambda k: _SEVERITY.get(k, 9))
        for counts in r["routes"].values():
            counts["share"] = share(counts["ms"] * 1e6)
        operators.append({**r, "route": worst, "share": share(r["total_ms"] * 1e6),
                          "native_for_other_dtypes": r["op"] in router.policy.native})
    operators.sort(key=lambda o: (_SEVERITY.get(o["route"], 9), -o["total_ms"], o["op"]))
    return {
        "backend": described["name"], "profile": described.get("profile"),
        "table": described.get("table"), "device_type": described["device_type"],
        "steps": steps, "time_basis": basis, "routes": routes, "operators": operators,
        "cuda_api_missing": cuda_api_missing(census.chip),
    }


def cuda_api_missing(chip) -> Optional[dict]:
    """The ``torch.cuda`` names the program used that the chip's device module lacks (each use
    raised ``UnsupportedFeatureError``): ``{"chip", "module", "origin", "names": [{"name",
    "uses"}]}``; None where the chip has no device-module table."""
    from ..tables.device_modules import missing_uses

    table = chip.device_module_table()
    if table is None:
        return None
    names = [{"name": f"torch.cuda.{name}", "uses": uses} for name, uses in missing_uses.rows(table.chip)]
    return {"chip": table.chip, "module": table.device_module, "origin": table.origin, "names": names}


def _per(value: Optional[float], steps: int, bytes_: bool = False) -> str:
    if value is None:
        return "-"
    value = value / steps if steps else value
    if bytes_:
        return format_bytes(int(round(value)))
    return str(int(value)) if value == int(value) else f"{value:.1f}"


def _columns(rows: List[tuple], indent: str = "  ") -> List[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def _render_cuda_api(missing: Optional[dict]) -> List[str]:
    if not missing or not missing["names"]:
        return []
    names = ", ".join(f"{n['name']} ({n['uses']} {'use' if n['uses'] == 1 else 'uses'})" for n in missing["names"])
    return [f"torch.cuda APIs the program used that {missing['chip']} lacks ({missing['module']} of "
            f"{missing['origin']} has no such name): {names}"]


def render(data: dict, limit: int = 12) -> str:
    """The verdict as text: one line per route, then the operators that did not run natively,
    costliest first (at most ``limit``)."""
    chip = data["profile"] or data["backend"]
    steps = data["steps"]
    origin = ""
    if data["table"]:
        table = data["table"]
        origin = f"; operator table of {table.get('package') or table.get('repository')} " \
                 f"{table.get('version') or table.get('ref')}"
    per = f"per optimizer step ({steps} steps)" if steps else "for the whole run (no optimizer step)"
    unit = "/STEP" if steps else ""
    rows = [("ROUTE", "OPERATORS", f"CALLS{unit}", "TIME SHARE", f"HOST BYTES{unit}")]
    for route in ROUTES:
        r = data["routes"][route]
        if r["operators"] == 0:
            rows.append((route, "0", "0", "-", "-"))
            continue
        rows.append((route, "-" if r["operators"] is None else str(r["operators"]), _per(r["calls"], steps),
                     format_share(r["share"]), _per(r["host_bytes"], steps, True)))
    lines = [f"verdict for {chip} ({data['backend']}, device {data['device_type']}{origin}), {per}:"]
    lines += _columns(rows)
    lines.append(f"  time share: of {data['time_basis']}; a decomposition's parts count within it")
    lines += _render_cuda_api(data.get("cuda_api_missing"))
    away = data["operators"]
    if not away:
        # a process that ran nothing on the device (a torchrun agent) says so, not "all native";
        # where native calls are not counted (a real chip), nothing is known of them
        untimed = data["routes"]["native"]["calls"] is None
        ran = untimed or any(r["calls"] for r in data["routes"].values())
        lines.append(f"every operator ran natively on {chip}" if ran else f"no operator ran on {chip} in this process")
        return "\n".join(lines)
    counts = {route: sum(o["route"] == route for o in away) for route in ROUTES[1:]}
    summary = ", ".join(f"{n} {route}" for route, n in counts.items() if n)
    noun = "operator" if len(away) == 1 else "operators"
    lines.append(f"{len(away)} {noun} would not run natively on {chip} ({summary}), costliest first:")
    rows = [("OPERATOR", "ROUTE", f"CALLS{unit}", "TIME SHARE", f"HOST BYTES{unit}", "DTYPES", "NOTE")]
    for o in away[:limit]:
        note = f"native except for {', '.join(o['dtypes'])}" if o["native_for_other_dtypes"] else ""
        rows.append((o["op"], o["route"], _per(o["calls"], steps), format_share(o["share"]),
                     _per(o["host_bytes"], steps, True), ",".join(o["dtypes"]), note))
    lines += _columns(rows)
    if len(away) > limit:
        lines.append(f"  ... and {len(away) - limit} more (--json lists them all)")
    return "\n".join(lines)
