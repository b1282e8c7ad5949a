"""The sim's speed against the CPU's: training steps with AdamW of the same model on CPU tensors
and on the sim, in one process, interleaved.

Workloads (float32, one intra-op thread, the model and optimizer built once per device):

- ``mlp``: Linear 256-512, LayerNorm, GELU, Linear 512-256, batch 64, MSE loss;
- ``gpt-small``: a nanoGPT-style GPT (``model.py``'s blocks: LayerNorm, causal self-attention
  through ``scaled_dot_product_attention``, GELU MLP, tied head), 2 layers, n_embd 64, 4 heads,
  vocabulary 65 (shakespeare_char), batch 8 x 64 tokens;
- ``gpt-medium``: the same GPT with 4 layers, n_embd 256, 8 heads;
- ``bert``: BERT-base (``transformers.BertConfig()``, random weights) for sequence
  classification, batch 2 x 32 tokens (skipped when transformers is not installed).

Each round times the same number of steps on each device (after warm-up steps): ``--steps``, or
by default as many as make a round of the CPU's at least 50 ms (a few milliseconds' sample is
noise: a timer tick or a collection moves it by tens of percent); the device order alternates
from round to round; per workload it reports the median step time of each device,
and the median and spread (min-max) of the per-round ratios sim/cpu. Each sim runtime
(``FL_SIM_RUNTIME=cpp`` and ``python``) runs in a child process of its own, since a process
has one; and so does each native set (``--sets``): ``default`` (the Core ATen set, the rest served
by the routing layer's composites and fallbacks) and ``device`` (a CUDA-like set,
``flagos_torchfl.sim.operators.native_ops.device_kernel_ops()``: every operator with a CPU kernel of its
own, the ``_foreach_*`` and fused optimizer kernels). ``--profile WORKLOAD`` prints where a sim step's time goes instead (torch.profiler's
operators by self CPU time, three steps). The machine's load average is printed before and after.

    python benchmarks/sim_speed.py [--rounds 7] [--steps N] [--only mlp,gpt-small]
                                   [--runtimes cpp,python] [--sets default,device] [--profile mlp]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

WORKLOADS = ("mlp", "gpt-small", "gpt-medium", "bert")


def build(name: str, device: str):
    """(model, optimizer, step function) of workload ``name`` on ``device``, seeded."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(256, 512), nn.LayerNorm(512), nn.GELU(), nn.Linear(512, 256))
        x, y = torch.randn(64, 256), torch.randn(64, 256)

        def loss_of(m, x, y):
            return F.mse_loss(m(x), y)
    elif name.startswith("gpt"):
        layers, embd, heads = (2, 64, 4) if name == "gpt-small" else (4, 256, 8)
        model = GPT(vocab=65, block=64, layers=layers, embd=embd, heads=heads)
        x = torch.randint(0, 65, (8, 64))
        y = torch.randint(0, 65, (8, 64))

        def loss_of(m, x, y):
            logits = m(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    elif name == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        model = BertForSequenceClassification(BertConfig())
        x = torch.randint(0, 30522, (2, 32))
        y = torch.randint(0, 2, (2,))

        def loss_of(m, x, y):
            return m(input_ids=x, labels=y).loss
    else:
        raise SystemExit(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model, x, y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def GPT(vocab: int, block: int, layers: int, embd: int, heads: int):
    """A GPT with nanoGPT's ``model.py`` structure (no dropout, bias on)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(embd, 3 * embd)
            self.c_proj = nn.Linear(embd, embd)

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(embd, dim=2)
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(embd), Attention()
            self.ln_2 = nn.LayerNorm(embd)
            self.mlp = nn.Sequential(nn.Linear(embd, 4 * embd), nn.GELU(), nn.Linear(4 * embd, embd))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(block, embd)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(embd)
            self.lm_head = nn.Linear(embd, vocab, bias=False)
            self.wte.weight = self.lm_head.weight
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

        def forward(self, idx):
            pos = torch.arange(idx.size(1), device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return Model()


def timed(step, steps: int, sync) -> float:
    """Seconds per step over ``steps`` steps (the last loss read back, as a training loop logs)."""
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss.item()
    sync()
    return (time.perf_counter() - start) / steps


ROUND_SECONDS = 0.05
"""The CPU's time a round lasts at least when ``--steps`` is not given."""


def child(workloads, rounds: int, steps: int | None, warmup: int) -> dict:
    """Run in a process with the sim active: per workload, the per-round step times and the
    steps per round."""
    import torch

    torch.set_num_threads(1)
    sync = torch.accelerator.synchronize
    results = {}
    for name in workloads:
        try:
            runs = {"cpu": build(name, "cpu"), "sim": build(name, "sim")}
        except ImportError as exc:
            results[name] = {"skipped": str(exc)}
            continue
        for side in runs:
            timed(runs[side], warmup, sync)
        per_round = steps or max(3, math.ceil(ROUND_SECONDS / timed(runs["cpu"], 1, sync)))
        times = {"cpu": [], "sim": [], "steps": per_round}
        for r in range(rounds):
            for side in (("cpu", "sim") if r % 2 == 0 else ("sim", "cpu")):
                times[side].append(timed(runs[side], per_round, sync))
        results[name] = times
        del runs
    return results


def profile(name: str, rows: int = 25) -> None:
    """Print torch.profiler's operator table of three sim steps of ``name``."""
    import torch

    torch.set_num_threads(1)
    step = build(name, "sim")
    timed(step, 2, torch.accelerator.synchronize)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        timed(step, 3, torch.accelerator.synchronize)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def activate(kind: str, native_set: str) -> None:
    os.environ["FL_BACKEND"] = "sim"
    os.environ["FL_SIM_RUNTIME"] = kind
    if native_set == "device":
        import tempfile

        from flagos_torchfl.sim.operators.native_ops import device_kernel_ops

        listing = os.path.join(tempfile.mkdtemp(), "device_ops.json")
        with open(listing, "w") as f:
            json.dump(sorted(device_kernel_ops()), f)
        os.environ["FL_SIM_NATIVE_OPS"] = listing
    elif native_set != "default":
        raise SystemExit(f"unknown native set {native_set!r}; valid: default, device")
    import flagos_torchfl as ft
    import flagos_torchfl.sim as fsim

    ft.auto_select_backend()
    if fsim.runtime_kind() != kind:
        raise SystemExit(f"the sim runs its {fsim.runtime_kind()} runtime, not {kind}")


def summary(times: dict) -> dict:
    ratios = [s / c for s, c in zip(times["sim"], times["cpu"])]
    return {"cpu_ms": statistics.median(times["cpu"]) * 1e3, "sim_ms": statistics.median(times["sim"]) * 1e3,
            "ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--runtimes", default="cpp,python")
    parser.add_argument("--sets", default="default,device")
    parser.add_argument("--profile", metavar="WORKLOAD")
    parser.add_argument("--child", metavar="RUNTIME", help=argparse.SUPPRESS)
    parser.add_argument("--child-set", default="default", help=argparse.SUPPRESS)
    args = parser.parse_args()
    workloads = [w.strip() for w in args.only.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}; valid: {', '.join(WORKLOADS)}")
    if args.child:
        activate(args.child, args.child_set)
        if args.profile:
            profile(args.profile)
            return
        print(json.dumps(child(workloads, args.rounds, args.steps, args.warmup)))
        return
    print(f"load average before: {os.getloadavg()}")
    runs = [(k.strip(), n.strip()) for n in args.sets.split(",") if n.strip()
            for k in args.runtimes.split(",") if k.strip()]
    for kind, native_set in runs:
        argv = [sys.executable, __file__, "--child", kind, "--child-set", native_set, "--only",
                ",".join(workloads), "--rounds", str(args.rounds), "--warmup", str(args.warmup)]
        if args.steps:
            argv += ["--steps", str(args.steps)]
        if args.profile:
            print(f"== {kind} runtime, {native_set} set: {args.profile}")
            subprocess.run(argv + ["--profile", args.profile], check=True)
            continue
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
        results = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"== FL_SIM_RUNTIME={kind}, {native_set} native set: {args.rounds} rounds")
        print(f"{'workload':<12} {'steps':>5} {'cpu ms':>9} {'sim ms':>9} {'sim/cpu':>8}  spread")
        for name, times in results.items():
            if "skipped" in times:
                print(f"{name:<12} skipped: {times['skipped']}")
                continue
            s = summary(times)
            print(f"{name:<12} {times['steps']:5d} {s['cpu_ms']:9.1f} {s['sim_ms']:9.1f} {s['ratio']:7.2f}x  "
                  f"{s['low']:.2f}-{s['high']:.2f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
