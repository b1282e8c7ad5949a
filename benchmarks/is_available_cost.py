"""Cost of ``torch.cuda.is_available()``: plain PyTorch against the facade's caller-aware answer
(the calling module's name is read to tell CUDA-kernel libraries the truth), interleaved rounds,
medians of per-call nanoseconds.

    python benchmarks/is_available_cost.py [--rounds 7] [--calls 300000]
"""
from __future__ import annotations

import argparse
import statistics
import timeit

import torch

import flagos_torchfl as ft


def per_call_ns(calls: int) -> float:
    return timeit.timeit("torch.cuda.is_available()", globals={"torch": torch}, number=calls) / calls * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300_000)
    args = parser.parse_args()
    plain, active = [], []
    for round_ in range(args.rounds):
        for mode in (("plain", "active") if round_ % 2 == 0 else ("active", "plain")):
            if mode == "active":
                ft.init_backend("cpu")
                active.append(per_call_ns(args.calls))
                ft.deactivate()
            else:
                plain.append(per_call_ns(args.calls))
    p, a = statistics.median(plain), statistics.median(active)
    print(f"plain PyTorch (CPU build): {p:7.1f} ns/call")
    print(f"cpu backend, caller-aware: {a:7.1f} ns/call  (ratio {a / p:.2f})")


if __name__ == "__main__":
    main()
