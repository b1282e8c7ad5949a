"""What the precision tools cost on the CPU, on a small MLP training step (64 -> 128 -> 10,
batch 32, Adam): the finite guard against the plain step, and ``enable_mixed_precision``'s
global module hooks against the same step written with ``torch.autocast`` by hand.

Pairs alternate their order; the table gives each side's median and the median of the per-pair
ratios. One intra-op thread (a small shared machine makes multi-threaded timings swing).

    python benchmarks/precision_costs.py             # 9 pairs of 100 steps
    python benchmarks/precision_costs.py --pairs 3   # a quick run
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from flagos_torchfl.precision import check_finite, enable_mixed_precision


def make_step(autocast: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step() -> None:
        if autocast:
            with torch.autocast("cpu", torch.bfloat16):
                out = model(x)
        else:
            out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def timed(step: Callable[[], None], steps: int, setup: Callable[[], Callable[[], None]]) -> float:
    undo = setup()
    try:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - start) / steps
    finally:
        undo()


def compare(name: str, base_step, base_setup, other_step, other_setup, pairs: int, steps: int):
    base_step(), other_step()
    base, other, ratios = [], [], []
    for i in range(pairs):
        order = [(base, base_step, base_setup), (other, other_step, other_setup)]
        for times, step, setup in (order if i % 2 == 0 else order[::-1]):
            times.append(timed(step, steps, setup))
        ratios.append(other[-1] / base[-1])
    print(f"{name:<44} {statistics.median(base) * 1e3:8.3f} ms {statistics.median(other) * 1e3:8.3f} ms"
          f"   ratio {statistics.median(ratios):5.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--steps", type=int, default=100)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    nothing = lambda: (lambda: None)  # noqa: E731
    print(f"{'comparison (per step)':<44} {'base':>11} {'other':>11}")
    plain = make_step(False)
    compare("finite guard vs plain (fp32)", plain, nothing, plain, lambda: check_finite(True),
            opts.pairs, opts.steps)
    compare("enable_mixed_precision vs autocast by hand", make_step(True), nothing, make_step(False),
            lambda: enable_mixed_precision("cpu", torch.bfloat16), opts.pairs, opts.steps)


if __name__ == "__main__":
    main()
