"""``surface``: every CUDA entry point of the installed torch and what a backend does with it
(redirected, answered, passed, refused), from the classification table; exits 1 listing the
entries the table does not classify."""
from __future__ import annotations

import json
from collections import Counter


def add_parser(sub) -> None:
    from ..surface.table import KINDS, PROFILES

    p = sub.add_parser("surface", help="list torch's CUDA entry points and each one's verdict on a backend")
    p.add_argument("--backend", choices=[k for k in KINDS if k not in PROFILES],
                   help="the backend whose verdicts are shown")
    p.add_argument("--profile", choices=PROFILES, help="a sim profile (its chip's device type and counterparts)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--unclassified", action="store_true", help="list only the entries the table does not classify")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..surface import entries, table

    if bool(args.backend) == bool(args.profile):
        print("surface: give --backend NAME or --profile CHIP")
        return 2
    kind = args.backend or args.profile
    rows = table.load().classify(entries.generate(), kind)
    missing = table.unclassified(rows)
    shown = missing if args.unclassified else rows
    if args.unclassified and not missing and not args.json:
        print(f"surface: all {len(rows)} entries of torch {_torch_version()} are classified")
        return 0
    if args.json:
        print(json.dumps({"backend": kind, "torch": _torch_version(), "counts": _counts(rows),
                          "unclassified": [_row_json(r) for r in missing],
                          "entries": [_row_json(r) for r in shown]}, indent=1))
    else:
        _print_table(kind, rows, shown)
    if missing:
        print(f"surface: {len(missing)} entries of torch {_torch_version()} are not classified "
              "(add them to src/flagos_torchfl/data/cuda_surface.json):")
        for row in missing:
            print(f"  {row.entry.name} ({row.entry.kind}, {', '.join(sorted(row.entry.reasons))}): {row.problem}")
        return 1
    return 0


def _print_table(kind: str, rows, shown) -> None:
    width = max((len(r.entry.name) for r in shown), default=5)
    print(f"{'ENTRY':<{width}}  {'VERDICT':<10}  {'PATCH':<20}  DETAIL")
    for row in shown:
        verdict = row.verdict
        if verdict is None:
            print(f"{row.entry.name:<{width}}  {'-':<10}  {'-':<20}  {row.problem}")
            continue
        detail = verdict.detail + (f" [the chip has {verdict.counterpart}]" if verdict.counterpart else "")
        print(f"{row.entry.name:<{width}}  {verdict.verdict:<10}  {verdict.patch or '-':<20}  {detail}")
    counts = _counts(rows)
    print(f"\n{len(rows)} entries on {kind} (torch {_torch_version()}): "
          + ", ".join(f"{n} {v}" for v, n in counts.items()))


def _counts(rows) -> dict:
    found = Counter(r.verdict.verdict if r.verdict else "unclassified" for r in rows)
    order = ("redirected", "answered", "passed", "refused", "unclassified")
    return {v: found[v] for v in order if found[v]}


def _row_json(row) -> dict:
    data = row.entry.to_json()
    if row.verdict is not None:
        data.update(row.verdict.to_json())
    else:
        data["problem"] = row.problem
    return data


def _torch_version() -> str:
    import torch

    return torch.__version__
