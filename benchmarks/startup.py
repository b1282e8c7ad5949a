"""Start-up cost: what importing and activating the package adds to a process that imports torch.

Every sample is a fresh interpreter; plain and activated samples alternate in pairs, the order
flipping every pair. Reported per case: the median wall time of each side, the median and the
spread (min–max) of the per-pair ratios activated/plain, the median ratio of CPU time (user +
system of the sample's whole process tree, from ``wait4``: on a loaded machine the steadier
figure) and the median peak resident memory of each side (``ru_maxrss``: the largest process
of the tree). This process imports neither torch nor the package, so that its own memory does
not become the children's floor.

- (a) ``python -c "import torch"`` against ``python -c "import torch, flagos_torchfl as ft;
  ft.auto_select_backend()"``, with ``FL_BACKEND=cpu`` and with ``FL_BACKEND=sim``;
- (a+) the same, each side then making the program's first 20,000 objects. ``import torch`` ends
  with a full collection of the cyclic garbage collector due (it runs at the next few hundred
  new objects, about 60–100 ms here): in (a) an activation that makes enough objects pays it,
  plain torch exits first; in (a+) both sides pay it once, as every program does;
- (b) ``python empty.py`` (a script holding ``import torch``) against
  ``python -m flagos_torchfl run empty.py`` (automatic selection: the cpu backend here);
- (c) a script iterating a DataLoader with 2 spawned workers (each worker a fresh interpreter
  that imports torch; under ``run`` each one is activated too), plain against under ``run``;
- (x) the exit alone: the sides of (a), each timed from its program's last line (a byte it
  writes) to the end of its process (exit handlers, the interpreter's teardown); the CPU-time
  ratio is left out (it would be the whole process's).

Before timing, the package's bytecode is compiled (``compileall``), as an installed package has
it: with ``PYTHONDONTWRITEBYTECODE=1`` the sources would otherwise be compiled on every import.
``FL_*`` variables of the calling environment are dropped; ``PYTHONPATH`` is kept (run it with
the checkout's ``src`` first to measure that tree). The machine's load average is printed
before and after.

    python benchmarks/startup.py [--pairs 9] [--only a,a+,b,c,x]
"""
from __future__ import annotations

import argparse
import compileall
import importlib.metadata
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

EMPTY = "import torch\n"
LOADER = textwrap.dedent('''\
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if __name__ == "__main__":
        data = TensorDataset(torch.arange(64.0).reshape(32, 2))
        loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="spawn")
        assert sum(batch[0].shape[0] for batch in loader) == 32
''')
ACTIVATE = "import torch, flagos_torchfl as ft; ft.auto_select_backend()"
#: the first lines of a program: 20,000 new objects the collector tracks
BEGUN = "; objects = [[] for _ in range(20000)]"
#: the program's last line in (x): one byte on its standard output, from which its exit is timed
LAST_LINE = "; import os; os.write(1, b'.')"
RUN = [sys.executable, "-m", "flagos_torchfl", "run"]


def cases(folder: Path) -> dict:
    """name -> (what it measures, plain argv, activated argv, extra environment)."""
    empty, loader = folder / "empty.py", folder / "loader.py"
    empty.write_text(EMPTY)
    loader.write_text(LOADER)
    plain = [sys.executable, "-c", "import torch"]
    begun = [sys.executable, "-c", "import torch" + BEGUN]
    return {
        "a-cpu": ("import torch vs + activation, cpu", plain, [sys.executable, "-c", ACTIVATE], {"FL_BACKEND": "cpu"}),
        "a-sim": ("import torch vs + activation, sim", plain, [sys.executable, "-c", ACTIVATE], {"FL_BACKEND": "sim"}),
        "a+-cpu": ("the same, then 20,000 objects, cpu", begun, [sys.executable, "-c", ACTIVATE + BEGUN],
                   {"FL_BACKEND": "cpu"}),
        "a+-sim": ("the same, then 20,000 objects, sim", begun, [sys.executable, "-c", ACTIVATE + BEGUN],
                   {"FL_BACKEND": "sim"}),
        "x-cpu": ("exit alone, cpu", [sys.executable, "-c", "import torch" + LAST_LINE],
                  [sys.executable, "-c", ACTIVATE + LAST_LINE], {"FL_BACKEND": "cpu"}),
        "x-sim": ("exit alone, sim", [sys.executable, "-c", "import torch" + LAST_LINE],
                  [sys.executable, "-c", ACTIVATE + LAST_LINE], {"FL_BACKEND": "sim"}),
        "b": ("python empty.py vs run empty.py", [sys.executable, str(empty)], [*RUN, str(empty)], {}),
        "c": ("DataLoader, 2 spawned workers, vs run", [sys.executable, str(loader)], [*RUN, str(loader)], {}),
    }


def sample(argv, env, exit_only: bool = False) -> tuple:
    """(wall seconds, CPU seconds, peak resident bytes) of one fresh process tree running ``argv``;
    ``exit_only``: the wall time from the byte the program writes last to the process's end."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE if exit_only else subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    if exit_only:
        proc.stdout.read(1)
        start = time.perf_counter()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    error = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if exit_only:
        proc.stdout.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{error[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def measure(plain, activated, env, pairs: int, exit_only: bool = False) -> dict:
    rows = []
    for i in range(pairs):
        order = (("plain", plain), ("activated", activated))
        got = dict((name, sample(argv, env, exit_only)) for name, argv in (order if i % 2 == 0 else order[::-1]))
        rows.append(got)
    ratios = [r["activated"][0] / r["plain"][0] for r in rows]
    median = statistics.median
    return {
        "plain_s": median(r["plain"][0] for r in rows), "activated_s": median(r["activated"][0] for r in rows),
        "ratio": median(ratios), "low": min(ratios), "high": max(ratios),
        "cpu_ratio": median(r["activated"][1] / r["plain"][1] for r in rows),
        "plain_mib": median(r["plain"][2] for r in rows) / 2**20,
        "activated_mib": median(r["activated"][2] for r in rows) / 2**20,
    }


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FL_")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--only", default="a,a+,b,c,x",
                        help="comma-separated: a, a+, b, c, x (a = a-cpu and a-sim; x likewise)")
    args = parser.parse_args()
    spec = importlib.util.find_spec("flagos_torchfl")  # found, not imported (nor is torch)
    package = os.path.dirname(spec.origin)
    compileall.compile_dir(package, quiet=1)
    wanted = {part.strip() for part in args.only.split(",")}
    print(f"torch {importlib.metadata.version('torch')}, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, flagos_torchfl from {package}")
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    print(f"{args.pairs} interleaved pairs per case\n")
    print("| case | plain (s) | activated (s) | median ratio | spread (min–max) | CPU-time ratio "
          "| peak MiB plain | activated |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, (label, plain, activated, extra) in cases(Path(folder)).items():
            if name.split("-")[0] not in wanted:
                continue
            exit_only = name.startswith("x")
            r = measure(plain, activated, {**environment(), **extra}, args.pairs, exit_only)
            cpu = "–" if exit_only else f"{r['cpu_ratio']:.3f}"
            print(f"| ({name}) {label} | {r['plain_s']:.3f} | {r['activated_s']:.3f} | {r['ratio']:.3f} | "
                  f"{r['low']:.3f}–{r['high']:.3f} | {cpu} | {r['plain_mib']:.1f} | {r['activated_mib']:.1f} |", flush=True)
    print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
