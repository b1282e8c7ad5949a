"""Where a CI leg's test time went, from its junit report: seconds per suite (the folder under
tests/), per module (pytest-xdist's unit of work with ``--dist loadfile``: a module longer than
about half the leg leaves a worker idle at its end) and the slowest tests. The figures are worker-seconds: with pytest-xdist's two workers the
leg's wall time is about half their sum. An isolated module runs whole in a child interpreter
during its first test, so that test carries the module's time, and so does a module fixture's
first user.

    python .ci/timings.py REPORT.xml [--slowest N]
"""
from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict


def cases(report: str):
    """(suite, module, test id, seconds) of every test case in a junit report."""
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        suite = parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]
        yield suite, module, f"{module}::{case.get('name')}", float(case.get("time") or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--slowest", type=int, default=20)
    args = parser.parse_args()
    rows = list(cases(args.report))
    per_suite: dict[str, list[float]] = defaultdict(list)
    per_module: dict[str, list[float]] = defaultdict(list)
    for suite, module, _, seconds in rows:
        per_suite[suite].append(seconds)
        per_module[module].append(seconds)
    total = sum(seconds for *_, seconds in rows)
    print(f"{len(rows)} tests, {total:.0f} worker-seconds")
    print("per suite (worker-seconds, tests):")
    for suite, times in sorted(per_suite.items(), key=lambda item: -sum(item[1])):
        print(f"  {suite:<14} {sum(times):7.0f} s  {len(times):5d}")
    print(f"slowest {args.slowest} modules (worker-seconds, tests):")
    for module, times in sorted(per_module.items(), key=lambda item: -sum(item[1]))[:args.slowest]:
        print(f"  {sum(times):7.1f} s  {len(times):5d}  {module}")
    print(f"slowest {args.slowest} tests:")
    for *_, name, seconds in sorted(rows, key=lambda row: -row[3])[:args.slowest]:
        print(f"  {seconds:7.1f} s  {name}")


if __name__ == "__main__":
    main()
