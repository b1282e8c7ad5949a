"""Run PyTorch's OpInfo database on the ``sim`` device through routing and report, per route,
the share of samples and the pass rate: once classifying each sample by the most costly route
any of its operators took (native < library < composite < fallback), once counting a sample in
every route it went through.

    python tools/opinfo_sweep.py --native core      # sim restricted to Core ATen
    python tools/opinfo_sweep.py --native small     # sim with ~40 native operators

OpInfos run in chunks, each in a subprocess; a chunk that dies (a segfault) is rerun one OpInfo
per subprocess, and an OpInfo that still dies is reported as a crash. ``--json FILE`` keeps the
full results (every failure with its error).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.conformance import harness  # noqa: E402


def run_chunk(native: str, names, workdir: str, timeout: float) -> tuple:
    """(results by OpInfo, names whose process died before they finished)."""
    fd, out = tempfile.mkstemp(suffix=".jsonl", dir=workdir)
    os.close(fd)
    cmd = [sys.executable, "-m", "tests.e2e.conformance.harness", native, out, ",".join(names)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        tail = (proc.stderr or "")[-600:]
        code = proc.returncode
    except subprocess.TimeoutExpired:
        tail, code = f"timed out after {timeout:g} s", "timeout"
    done = {}
    with open(out, encoding="utf-8") as fh:
        for line in fh:
            record = json.loads(line)
            done[record["op"]] = record["outcomes"]
    missing = [n for n in names if n not in done]
    return done, missing, code, tail


def sweep(native: str, names, chunk: int, jobs: int, timeout: float) -> dict:
    results, crashes = {}, {}
    with tempfile.TemporaryDirectory() as workdir:
        chunks = [names[i:i + chunk] for i in range(0, len(names), chunk)]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for done, missing, code, tail in pool.map(lambda c: run_chunk(native, c, workdir, timeout), chunks):
                results.update(done)
                for name in missing:  # rerun alone what the dead process had not finished
                    alone, still, code1, tail1 = run_chunk(native, [name], workdir, timeout)
                    results.update(alone)
                    if still:
                        crashes[name] = f"worker exited with {code1}: {tail1.strip().splitlines()[-1] if tail1.strip() else ''}"
    outcomes = [harness.Outcome(**o) for rows in results.values() for o in rows]
    for name, why in crashes.items():
        outcomes.append(harness.Outcome(name, -1, "native", False, "crash", why))
    return {"summary": harness.summarise(outcomes), "crashes": crashes}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--native", choices=("core", "small"), required=True)
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all float32 OpInfos)")
    parser.add_argument("--chunk", type=int, default=40, help="OpInfos per subprocess")
    parser.add_argument("--jobs", type=int, default=1, help="subprocesses at a time")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess")
    parser.add_argument("--json", help="write the full results here")
    args = parser.parse_args(argv)
    all_ops = [harness.opinfo_id(op) for op in harness.float32_opinfos()]
    names = args.ops.split(",") if args.ops else [n for n in all_ops if n not in harness.SKIP]
    start = time.time()
    data = sweep(args.native, names, args.chunk, args.jobs, args.timeout)
    data.update(native=args.native, opinfos=len(names), skipped=len(all_ops) - len(names) if not args.ops else 0,
                total_opinfos=len(all_ops), seconds=round(time.time() - start))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
    s = data["summary"]
    print(f"native set: {args.native}; OpInfos run: {data['opinfos']} (skipped {data['skipped']} of "
          f"{data['total_opinfos']}); samples: {s['samples']}; passed: {s['passed']} "
          f"({100 * (s['pass_rate'] or 0):.2f}%); crashes: {len(data['crashes'])}; {data['seconds']} s")
    print("BY MOST COSTLY ROUTE (each sample once)            | THROUGH THE ROUTE (a sample in each route it took)")
    print(f"{'ROUTE':<12}{'SAMPLES':>9}{'SHARE':>9}{'PASSED':>9}{'PASS RATE':>11}  |{'SAMPLES':>9}{'SHARE':>9}{'PASS RATE':>11}")
    pct = lambda v: "-" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    for route, r in s["routes"].items():
        print(f"{route:<12}{r['samples']:>9}{pct(r['share']):>9}{r['passed']:>9}{pct(r['pass_rate']):>11}  |"
              f"{r['through']:>9}{pct(r['through_share']):>9}{pct(r['through_pass_rate']):>11}")
    failing = {}
    for f in s["failures"]:
        failing.setdefault(f["op"], []).append(f)
    if failing:
        print(f"\nfailing OpInfos ({len(failing)}):")
        for op, rows in sorted(failing.items()):
            print(f"  {op}: {len(rows)} sample(s), e.g. [{rows[0]['route']}/{rows[0]['stage']}] {rows[0]['error'][:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
