"""``ops``: the route every operator takes on a backend or sim profile, its category coverage,
export of a chip's native operator table (replayable on ``sim`` with ``FL_SIM_NATIVE_OPS=FILE``),
and the comparison of two chips' tables by category (``--diff``)."""
from __future__ import annotations

import json
import sys
from collections import Counter

from ..errors import FlagOSError
from ..routing.overrides import ROUTES


def add_parser(sub) -> None:
    p = sub.add_parser("ops", help="list the route of every operator on a backend; export its native table")
    p.add_argument("--backend", help="backend name or alias (e.g. sim, cpu, ascend)")
    p.add_argument("--profile", metavar="CHIP",
                   help="a sim profile (ascend, cambricon, mthreads): the chip's published operator table")
    p.add_argument("--diff", metavar="OTHER",
                   help="compare with OTHER (a profile, or a backend whose kernels this torch has, e.g. "
                        "cpu or cuda) by category: what a model loses and gains moving there")
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
    if bool(args.backend) == bool(args.profile):
        print("ops: give --backend NAME or --profile CHIP (or --names)")
        return 2
    try:
        if args.diff:
            return _diff(args)
        if args.profile:
            from ..backends import registry
            from ..tables.profile_specs import check_profile, native_set

            backend = registry().profile(check_profile(args.profile.strip().lower(), "--profile"))
            native = native_set(backend.profile)
        else:
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


def _operator_table(name: str):
    """(label, native overloads) of a profile's published table, or of a backend: the kernels
    this torch registers for its dispatch key (cpu, cuda ...), or its runtime's (sim)."""
    import torch

    from ..aten.dispatcher import native_set
    from ..tables.profile_specs import known_table_ops, profiles
    from ..errors import ConfigError
    from ..routing import plan

    from ..backends import get_backend

    key = name.strip().lower()
    if key in profiles():
        from ..tables import op_tables

        source = op_tables.load(key).source
        origin = f"{source.get('package') or source.get('repository')} {source.get('version') or source.get('ref')}"
        return f"{key} ({origin})", known_table_ops(key)[0]
    backend = get_backend(key)
    if backend.dispatch_key == "PrivateUse1":
        return f"{backend.name}", plan.native_table(backend)
    ops = native_set(backend.dispatch_key)
    if "aten::add.Tensor" not in ops:
        raise ConfigError(f"this torch build ({torch.__version__}) registers no {backend.dispatch_key} kernels, "
                          f"so it has no {backend.name} table; run `ops --diff {backend.name}` where a "
                          f"{backend.name} build of torch is installed (no device is needed)")
    return f"{backend.name} (torch {torch.__version__} dispatcher)", ops


def _diff(args) -> int:
    from ..routing import plan

    first = args.profile or args.backend
    a_label, a_ops = _operator_table(first)
    b_label, b_ops = _operator_table(args.diff)
    result = plan.compare(a_label, a_ops, b_label, b_ops)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for side in ("from", "to"):
        r = result[side]
        print(f"{r['name']}: {r['operators']} operators reach the backend, {r['categories']} common categories native")
    short_a, short_b = a_label.split(" (")[0], b_label.split(" (")[0]
    for kind, verb, other in (("lost", "loses", short_b), ("gained", "gains", short_a)):
        categories, operators = result[f"categories_{kind}"], result[f"operators_{kind}"]
        count = len({op for ops in operators.values() for op in ops})
        print(f"\nmoving from {short_a} to {short_b} {verb} {len(categories)} common categories and "
              f"{count} operators" + (":" if categories or operators else ""))
        for category, lacking in categories.items():
            needs = "; ".join(" or ".join(entry.split("|")) for entry in lacking)
            print(f"  category {category}: {other} has none of {needs}")
        for category, ops in operators.items():
            shown = ", ".join(op[len("aten::"):] for op in ops[:6]) + (f", ... ({len(ops)})" if len(ops) > 6 else "")
            print(f"  {category:<22} {shown}")
    return 0
