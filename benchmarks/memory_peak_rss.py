"""Peak resident memory of a ResNet-50-layout training step on the CPU: plain PyTorch against
the same step with the cpu backend active (``ft.init_backend("cpu")``, the model moved with
``.cuda()``).

Each sample is a fresh interpreter that builds the model (transformers ``ResNetConfig()``, whose
defaults are ResNet-50's layout, random weights), runs ``--steps`` SGD steps on a random batch
and reports its peak resident memory (``getrusage`` ``ru_maxrss``). Plain and active samples
alternate, the order flipping every pair.

    python benchmarks/memory_peak_rss.py [--pairs 5] [--batch 4] [--steps 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def child(mode: str, batch: int, steps: int) -> None:
    import resource

    import torch
    import transformers

    torch.set_num_threads(1)
    device = "cpu"
    if mode == "active":
        import flagos_torchfl as ft

        ft.init_backend("cpu")
        device = "cuda"
    torch.manual_seed(0)
    model = transformers.ResNetForImageClassification(transformers.ResNetConfig()).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, model.config.num_labels, (batch,), device=device)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(pixel_values=x).logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"mode": mode, "peak": peak, "loss": loss.item()}))


def sample(mode: str, batch: int, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FL_")}
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--batch", str(batch),
                          "--steps", str(steps)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--child", choices=("plain", "active"))
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.batch, args.steps)
    peaks = {"plain": [], "active": []}
    ratios = []
    for i in range(args.pairs):
        order = ("plain", "active") if i % 2 == 0 else ("active", "plain")
        got = {mode: sample(mode, args.batch, args.steps) for mode in order}
        assert got["plain"]["loss"] == got["active"]["loss"], got
        for mode in peaks:
            peaks[mode].append(got[mode]["peak"])
        ratios.append(got["active"]["peak"] / got["plain"]["peak"])
        print(f"pair {i}: plain {got['plain']['peak'] / 2**20:.1f} MiB, "
              f"active {got['active']['peak'] / 2**20:.1f} MiB, ratio {ratios[-1]:.4f}", flush=True)
    print(f"median peak RSS: plain {statistics.median(peaks['plain']) / 2**20:.1f} MiB, "
          f"active {statistics.median(peaks['active']) / 2**20:.1f} MiB; median ratio "
          f"{statistics.median(ratios):.4f} (min {min(ratios):.4f}, max {max(ratios):.4f})")


if __name__ == "__main__":
    main()
