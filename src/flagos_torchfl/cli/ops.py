"""``ops``: the route every operator takes on a backend, its category coverage, and export of a
chip's native operator table (replayable on ``sim`` with ``FL_SIM_NATIVE_OPS=FILE``)."""
from __future__ import annotations

import json
import sys
from collections import Counter

from ..errors import FlagOSError
from ..routing.overrides import ROUTES


def add_parser(sub) -> None:
    p = sub.add_parser("ops", help="list the route of every operator on a backend; export its native table")
    p.add_argument("--backend", help="backend name or alias (e.g. sim, cpu, ascend)")
    p.add_argument("--route", choices=ROUTES, help="list only operators taking this route")
    p.add_argument("--export", metavar="FILE",
                   help="write the backend's native operator table as JSON (replay it with FL_SIM_NATIVE_OPS=FILE)")
    p.add_argument("--categories", action="store_true", help="show which common categories are native")
    p.add_argument("--names", action="store_true", help="list the semantic names and categories, then exit")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _names(as_json: bool) -> str:
    from ..aten import names

    table = names.table()
    if as_json:
        return json.dumps({"categories": table["categories"], "names": table["names"]}, indent=2)
    lines = ["CATEGORY              DESCRIPTION"]
    lines += [f"{c:<21} {v['description']}" for c, v in table["categories"].items()]
    lines.append("\nNAME -> CATEGORIES / OPERATORS (matched ignoring case, '_', '-' and spaces)")
    lines += [f"{n} -> {', '.join(t)}" for n, t in table["names"].items()]
    return "\n".join(lines)


def run(args) -> int:
    from ..backends import get_backend
    from ..routing import plan

    if args.names:
        print(_names(args.json))
        return 0
    if not args.backend:
        print("ops: give --backend NAME (or --names)")
        return 2
    try:
        backend = get_backend(args.backend)
        native = plan.native_table(backend)
        rows = plan.plan(backend, native) if not args.export else []
    except FlagOSError as exc:
        print(f"ops: {exc}")
        return 1
    if args.export:
        import torch

        data = {"backend": backend.name, "torch": torch.__version__, "native_ops": sorted(native)}
        try:
            with open(args.export, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1)
                fh.write("\n")
        except OSError as exc:
            print(f"ops: cannot write {args.export!r}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"wrote {len(native)} native operators of {backend.name} to {args.export}; "
              f"replay with FL_SIM_NATIVE_OPS={args.export} FL_BACKEND=sim")
        return 0
    yes, no = plan.category_coverage(native)
    counts = Counter(r["route"] for r in rows)
    shown = [r for r in rows if not args.route or r["route"] == args.route]
    if args.json:
        print(json.dumps({"backend": backend.name, "routes": dict(counts), "operators": shown,
                          "categories": {"native": yes, "routed": no}}, indent=1))
        return 0
    if not args.categories:
        width = max((len(r["op"]) for r in shown), default=8)
        print(f"{'OPERATOR'.ljust(width)}  {'ROUTE'.ljust(11)}  DETAIL")
        for r in shown:
            print(f"{r['op'].ljust(width)}  {r['route'].ljust(11)}  {r['detail']}".rstrip())
    else:
        for c in yes:
            print(f"native  {c}")
        for c in no:
            print(f"routed  {c}")
    summary = ", ".join(f"{counts.get(r, 0)} {r}" for r in ROUTES)
    print(f"\n{backend.name}: {len(rows)} operators reach the backend: {summary}; "
          f"{len(yes)}/{len(yes) + len(no)} common categories native")
    return 0
