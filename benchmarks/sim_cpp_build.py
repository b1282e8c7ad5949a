"""What the sim's C++ runtime costs: its build at first use, and each process's activation.

    python benchmarks/sim_cpp_build.py [--builds 3] [--pairs 9]

(a) builds: ``cpp.load()`` into an empty cache folder, each time: wall time and the compiler's
    CPU time (children's rusage).
(b) activation: fresh interpreters running ``ft.init_backend("sim")`` with ``FL_SIM_RUNTIME``
    ``cpp`` (the build cached) and ``python``, alternating, order flipping every pair; the
    median of each and of the per-pair ratios (the time of ``import torch`` is not counted).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ACTIVATE = ("import time, torch; t = time.perf_counter(); import flagos_torchfl as ft; "
            "ft.init_backend('sim'); print(time.perf_counter() - t)")


def build_once() -> tuple[float, float]:
    from flagos_torchfl.sim.runtime import cpp

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        cpp.load(cache_dir=Path(folder))
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def activation(runtime: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FL_")}
    env["FL_SIM_RUNTIME"] = runtime
    out = subprocess.run([sys.executable, "-c", ACTIVATE], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--builds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=9)
    args = parser.parse_args()
    builds = [build_once() for _ in range(args.builds)]
    print(f"(a) build: wall median {statistics.median(w for w, _ in builds):.1f} s "
          f"(min {min(w for w, _ in builds):.1f}, max {max(w for w, _ in builds):.1f}); compiler CPU "
          f"median {statistics.median(c for _, c in builds):.1f} s over {len(builds)} builds")
    activation("cpp")  # the cached build for this torch and compiler exists from here on
    compiled, python, ratios = [], [], []
    for i in range(args.pairs):
        order = ("cpp", "python") if i % 2 == 0 else ("python", "cpp")
        got = {runtime: activation(runtime) for runtime in order}
        compiled.append(got["cpp"])
        python.append(got["python"])
        ratios.append(got["cpp"] / got["python"])
    print(f"(b) activation after import torch, {args.pairs} pairs: cpp {statistics.median(compiled) * 1000:.0f} ms, "
          f"python {statistics.median(python) * 1000:.0f} ms, median ratio {statistics.median(ratios):.3f} "
          f"(spread {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
