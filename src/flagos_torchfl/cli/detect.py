"""``detect``: which chips are here, drivers, operator counts, memory, and what auto picks."""
from __future__ import annotations

import json
import textwrap
from typing import Optional

from .. import autoload, compat
from ..backends import registry
from ..machine.bounded_calls import probe_timeout, query_drivers
from ..config import format_bytes
from ..routing.plan import category_summary
from ..selection import would_pick


def add_parser(sub) -> None:
    p = sub.add_parser("detect", help="list the chips on this machine and what each backend can do")
    p.add_argument("--json", action="store_true", help="print the same data as JSON")
    p.set_defaults(func=run)


def collect() -> dict:
    """Probe every registered backend and say what auto would pick. The vendors' query tools run
    all at once (one ``FL_PROBE_TIMEOUT`` in all), then each backend's runtime is probed (each
    step bounded). Raises ConfigError for a bad ``FL_PROBE_TIMEOUT``."""
    reg = registry()
    timeout = probe_timeout()
    rows = []
    probes = {}
    backends = reg.backends()
    drivers = query_drivers(backends, timeout)
    for backend in backends:
        result = backend.probe(timeout, driver=drivers[backend.name])
        probes[backend.name] = result
        rows.append({**backend.describe(), **result.as_dict(), "device_count": result.device_count,
                     "categories": category_summary(backend, result.available)})
    for name, reason in reg.load_errors.items():
        rows.append({"name": name, "backend": name, "status": "unavailable", "reason": reason,
                     "devices": [], "device_count": 0})
    pick, why = would_pick(probe=lambda name: probes[name])
    return {"backends": rows, "auto_select": {"backend": pick, "why": why}, "sim_profiles": sim_profiles(),
            "autoload_disabled_for": autoload.disabled_plugins(), "torch": compat.torch_support()}


def sim_profiles() -> list:
    """One row per sim profile (``FL_SIM_PROFILE``): the chip's table and the traits it brings,
    and whether the simulated device can take the chip's device type name in this process."""
    from ..backends import registry
    from ..tables import chip_models
    from ..tables.profile_specs import native_set, profiles

    rows = []
    for name in profiles():
        backend = registry().profile(name)
        source = backend.table.source
        rows.append({
            "profile": name, "table": f"{source.get('package') or source.get('repository')} "
                                      f"{source.get('version') or source.get('ref')}",
            "native_ops": len(native_set(name)), "device_type": backend.device_type,
            "chip_device_type": backend.chip.device_type, "rename_problem": backend.rename_problem,
            "collective": backend.collective, "low_precision_dtype": backend.low_precision_dtype,
            "float64": "native" if backend.supports_float64 else "routed",
            "memory": backend.model.memory, "visible_devices_env": backend.visible_devices_env,
            "models": [m.spec for m in chip_models.all_models().get(name, ())],
        })
    return rows


#: a reason longer than this is printed below the table, the row pointing to it
_LONG_REASON = 70


def _status(row: dict, notes: Optional[list] = None) -> str:
    """The status cell; a long reason goes to ``notes`` (when given), the cell pointing to it."""
    if notes is not None and row["status"] == "unavailable" and len(row["reason"] or "") > _LONG_REASON:
        notes.append(f"{row['name']}: {row['reason']}")
        return f"not available (note {len(notes)})"
    if row["status"] == "available":
        return "available"
    if row["status"] == "misconfigured":
        return f"misconfigured: {row['reason']}"
    if row["status"] == "on-request":
        return f"available on request (FL_BACKEND={row['name']})"
    return f"not available: {row['reason']}"


def _devices(row: dict) -> str:
    devices = row["devices"]
    if not devices:
        return "0"
    names = sorted({d["name"] for d in devices})
    return f"{len(devices)} x {', '.join(names)}"


def _memory(row: dict) -> str:
    sizes = sorted({d["total_memory"] for d in row["devices"] if d.get("total_memory")})
    return ", ".join(format_bytes(s) for s in sizes) or "-"


def _version(row: dict) -> str:
    parts = [f"driver {row['driver']}"] if row.get("driver") else []
    if row.get("runtime"):
        parts.append(row["runtime"])
    return "; ".join(parts) or "-"


def render(data: dict) -> str:
    header = ("BACKEND", "STATUS", "DEVICES", "DRIVER / RUNTIME", "NATIVE OPS", "CATEGORIES", "MEMORY/DEVICE")
    table, notes = [header], []
    for row in data["backends"]:
        ops = row.get("native_ops")
        table.append((row["name"], _status(row, notes), _devices(row), _version(row),
                      "-" if ops is None else str(ops), row.get("categories") or "-", _memory(row)))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    lines.append("CATEGORIES: common operation categories the backend runs natively "
                 "(`python -m flagos_torchfl ops --backend NAME --categories`)")
    for number, note in enumerate(notes, 1):
        lines += textwrap.wrap(note, 100, initial_indent=f"note {number}: ", subsequent_indent="  ",
                               break_on_hyphens=False)
    lines += _autoload_note(data.get("autoload_disabled_for") or {})
    lines += ["", *_render_profiles(data["sim_profiles"])]
    support = data["torch"]
    lines.append(f"TORCH: {support['version']} (flagos_torchfl needs torch>={support['minimum']}; "
                 f"the sim device torch>={support['sim_minimum']})")
    pick = data["auto_select"]
    if pick["backend"]:
        lines.append(f"\nauto_select_backend() would pick: {pick['backend']} ({pick['why']})")
    else:
        lines.append(f"\nauto_select_backend() would fail: {pick['why']}")
    return "\n".join(lines)


def _autoload_note(disabled: dict) -> list:
    """What a plain ``python`` does on this machine when a device plugin cannot load."""
    if not disabled:
        return []
    names = ", ".join(sorted(disabled))
    text = (f"torch's auto-load of device plugins is off in this process (TORCH_DEVICE_BACKEND_AUTOLOAD=0) "
            f"because {names} cannot load (the note above says why). A plain `python train.py` fails inside "
            f"`import torch` until that is fixed; meanwhile `python -m flagos_torchfl run train.py` runs it on "
            f"the next backend, or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 yourself.")
    return ["", *textwrap.wrap(text, 100, break_on_hyphens=False)]


def _render_profiles(rows: list) -> list:
    table = [("SIM PROFILE", "OPERATOR TABLE", "NATIVE OPS", "DEVICE", "COLLECTIVE", "LOW PRECISION",
              "FLOAT64", "MEMORY/DEVICE", "VISIBLE DEVICES")]
    for r in rows:
        device = r["device_type"] if not r["rename_problem"] else f"sim (not {r['chip_device_type']})"
        table.append((r["profile"], r["table"], str(r["native_ops"]), device, r["collective"],
                      r["low_precision_dtype"], r["float64"], format_bytes(r["memory"]) if r["memory"] else "-",
                      r["visible_devices_env"] or "-"))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    lines.append("SIM PROFILE: `run --profile NAME` (or FL_BACKEND=sim FL_SIM_PROFILE=NAME) runs a program on the "
                 "sim answering as that chip (as its first model); NAME:MODEL as another model")
    lines += [f"  {r['profile']} models: {', '.join(r['models'])}" for r in rows if r["models"]]
    lines += [f"  {r['profile']}: the device stays 'sim': {r['rename_problem']}" for r in rows if r["rename_problem"]]
    return lines


def run(args) -> int:
    data = collect()
    print(json.dumps(data, indent=2) if args.json else render(data))
    return 0
