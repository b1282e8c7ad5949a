"""How often a finished 2-rank DDP job on gloo exits cleanly: plain torch against the same job
under ``python -m flagos_torchfl run``, alternating, under ``torchrun --nproc_per_node 2``.

    python benchmarks/exit_reliability.py [--runs 20] [--modes plain,run] [--timeout 120]
                                          [--ending destroy|none] [--cuda-written]
                                          [--backend cpu|sim] [--keep DIR]

The job trains a small model for 30 SGD steps (DDP, gloo), and then ends with
``dist.destroy_process_group()`` (``--ending destroy``) or with nothing (``--ending none``).
``--cuda-written`` writes it as a CUDA script (``"cuda"`` device and ``"nccl"`` when
``torch.cuda.is_available()``, as the DDP tutorial does); plain torch on a CPU build then runs it on
the CPU. ``--backend sim`` runs only the ``run`` side, on the simulated accelerator (a CUDA-written
job; plain torch has no such device). Modes: ``plain`` (torch alone), ``run`` (under the launcher),
``import`` (plain torch with the package imported by the job but not activated).

Each run is classified as ``clean`` (exit 0, both ranks finished training), ``abort`` (a rank ended
by a signal or printed ``terminate called``), ``hang`` (not done within ``--timeout`` seconds: its
whole process tree is killed) or ``failed`` (any other non-zero exit). ``--keep DIR`` keeps the
output of every run that was not clean.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = '''\
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

CUDA_WRITTEN, ENDING = sys.argv[1] == "cuda", sys.argv[2]
if sys.argv[3:] == ["import"]:
    import flagos_torchfl  # noqa: F401  (imported, not activated)
use_cuda = CUDA_WRITTEN and torch.cuda.is_available()
dist.init_process_group("nccl" if use_cuda else "gloo")
rank = dist.get_rank()
device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).to(device)
ddp = DDP(model, device_ids=[0] if use_cuda else None)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
generator = torch.Generator().manual_seed(rank)
for step in range(30):
    x = torch.randn(32, 64, generator=generator).to(device)
    y = torch.randn(32, 8, generator=generator).to(device)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
print(f"rank {rank} trained", flush=True)
if ENDING == "destroy":
    dist.destroy_process_group()
'''

SIGNAL_WORDS = ("terminate called", "Signal ", "SIGABRT", "SIGSEGV", "exitcode  : -")


MODES = ("plain", "run", "import")


def command(mode: str, job: Path, args) -> list:
    """The command line of one run of ``mode`` (one of :data:`MODES`)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                str(job), "cuda" if args.cuda_written else "cpu", args.ending]
    if mode == "import":
        return torchrun + ["import"]
    if mode == "plain":
        return torchrun
    return [sys.executable, "-m", "flagos_torchfl", "run", "--backend", args.backend, "--", *torchrun]


def run_once(cmd: list, timeout: float, env: dict) -> tuple:
    """Run ``cmd`` in its own session; returns (outcome, seconds, output). A run over ``timeout`` has
    its whole process group killed."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    try:
        output, _ = proc.communicate(timeout=timeout)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        hung = True
    seconds = time.perf_counter() - start
    trained = output.count("trained") >= 2
    if hung:
        outcome = "hang"
    elif proc.returncode == 0 and trained:
        outcome = "clean"
    elif proc.returncode < 0 or any(word in output for word in SIGNAL_WORDS):
        outcome = "abort"
    else:
        outcome = "failed"
    return outcome, seconds, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each mode")
    parser.add_argument("--modes", default="plain,run", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a run is a hang")
    parser.add_argument("--ending", choices=("destroy", "none"), default="destroy")
    parser.add_argument("--cuda-written", action="store_true")
    parser.add_argument("--backend", choices=("cpu", "sim"), default="cpu")
    parser.add_argument("--keep", type=Path, help="folder for the output of runs that were not clean")
    args = parser.parse_args()
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    if args.backend == "sim":
        args.cuda_written = True
        modes = ("run",)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    counts = {m: {"clean": 0, "abort": 0, "hang": 0, "failed": 0} for m in modes}
    seconds = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "ddp_job.py"
        job.write_text(JOB)
        for i in range(args.runs):
            order = modes[i % len(modes):] + modes[:i % len(modes)]
            for mode in order:
                outcome, took, output = run_once(command(mode, job, args), args.timeout, env)
                counts[mode][outcome] += 1
                seconds[mode].append(took)
                print(f"{i + 1:3d} {mode:5s} {outcome:6s} {took:6.1f}s", flush=True)
                if outcome != "clean" and args.keep is not None:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    (args.keep / f"{i + 1:03d}-{mode}-{outcome}.txt").write_text(output)
    label = f"ending={args.ending}, {'CUDA-written' if args.cuda_written else 'CPU'} job, backend {args.backend}"
    print(f"\n{args.runs} runs each, {label}")
    for mode in modes:
        c = counts[mode]
        median = sorted(seconds[mode])[len(seconds[mode]) // 2]
        print(f"{mode:5s}: clean {c['clean']:3d}  abort {c['abort']:3d}  hang {c['hang']:3d}  "
              f"failed {c['failed']:3d}  (median {median:.1f}s per run)")


if __name__ == "__main__":
    main()
