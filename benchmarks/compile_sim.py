"""A compiled against an eager training step on sim (Inductor's host C++ kernels on sim memory),
with plain PyTorch on CPU tensors in the same process as the reference: the first compiled call
(compilation), then interleaved rounds of steps, medians of per-step milliseconds.

The sim is a simulator: every eager operator is a Python kernel over host views, so the point is
that compilation works there and what it costs, not the speed of a chip.

    python benchmarks/compile_sim.py [--rounds 7] [--steps 20]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

import flagos_torchfl as ft


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.LayerNorm(512), nn.GELU(), nn.Linear(512, 512),
                         nn.GELU(), nn.Linear(512, 256))


def stepper(net: nn.Module, device: str, compiled: bool):
    net = net.to(device)
    run = torch.compile(net) if compiled else net
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)).to(device)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = run(x).square().mean()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def per_step_ms(step, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    ft.init_backend("sim")
    configs = {"cpu eager (plain PyTorch)": ("cpu", False), "cpu compiled": ("cpu", True),
               "sim eager": ("sim", False), "sim compiled": ("sim", True)}
    steps, first = {}, {}
    for name, (device, compiled) in configs.items():
        steps[name] = stepper(model(), device, compiled)
        start = time.perf_counter()
        steps[name]()  # compiles forward and backward when compiled
        first[name] = time.perf_counter() - start
    times = {name: [] for name in configs}
    names = list(configs)
    for round_ in range(args.rounds):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            times[name].append(per_step_ms(steps[name], args.steps))
    base = statistics.median(times[names[0]])
    print(f"{'configuration':28} {'first call (s)':>14} {'step (ms)':>10} {'vs plain':>9}")
    for name in names:
        med = statistics.median(times[name])
        print(f"{name:28} {first[name]:14.2f} {med:10.2f} {med / base:9.2f}")


if __name__ == "__main__":
    main()
