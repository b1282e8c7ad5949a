"""What the redirection layer costs: CUDA-written code under flagos_torchfl vs the same code
written for the real device, in one process.

Each pair activates the backend, runs the workload with ``device="cuda"`` (the CUDA-written
form, redirected), deactivates, and runs it again with the backend's own device (plain). The
order inside a pair alternates, so slow drift of the machine favours neither side. The table
gives each side's median time, the median of the per-pair ratios (activated / plain) and their
spread (min–max). Both sides are warmed up once before the pairs. On the CPU backend torch runs
one intra-op thread unless ``--threads`` says otherwise: on a small shared machine OpenMP
threads that compete with other processes make timings swing tenfold. It also measures, in
fresh interpreters, ``import torch``, ``import flagos_torchfl`` after it, and the first
activation.

    python benchmarks/redirect_overhead.py            # the full run (bert-base, resnet-50, ...)
    python benchmarks/redirect_overhead.py --quick    # a smoke run: 3 pairs, reduced models
    python benchmarks/redirect_overhead.py --backend cuda --pairs 11
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch

import flagos_torchfl as ft

Workload = Callable[[str], float]


def synchronize(device: str) -> None:
    """Wait for queued device work (CUDA-like devices), so the clock measures it."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind != "cpu" and hasattr(getattr(torch, kind, None), "synchronize"):
        getattr(torch, kind).synchronize()


def mlp_workload(steps: int) -> Tuple[str, Workload]:
    """(a) a small MLP trained for ``steps`` Adam steps; every batch moved with ``.to(device)``."""
    torch.manual_seed(0)
    batches = [torch.randn(32, 64) for _ in range(8)]
    targets = [torch.randn(32, 8) for _ in range(8)]
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))

    def run(device: str) -> float:
        model.to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        synchronize(device)
        start = time.perf_counter()
        for step in range(steps):
            x = batches[step % 8].to(device, non_blocking=True)
            y = targets[step % 8].to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        synchronize(device)
        return time.perf_counter() - start

    return f"(a) MLP, {steps} Adam steps", run


def _model_step(name: str, model: torch.nn.Module, make_inputs: Callable[[str], dict], steps: int) -> Tuple[str, Workload]:
    def run(device: str) -> float:
        model.to(device)
        inputs = make_inputs(device)
        synchronize(device)
        start = time.perf_counter()
        for _ in range(steps):
            model(**inputs).loss.backward()
            model.zero_grad(set_to_none=True)
        synchronize(device)
        return (time.perf_counter() - start) / steps

    return name, run


def bert_workload(quick: bool) -> Tuple[str, Workload]:
    """(b) BertForSequenceClassification, bert-base config, random init, batch 8x128, fwd+bwd."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=256) if quick else BertConfig()
    model = BertForSequenceClassification(config)
    ids = torch.randint(0, config.vocab_size, (8, 128))

    def inputs(device: str) -> dict:
        return {"input_ids": ids.to(device), "attention_mask": torch.ones(8, 128, dtype=torch.long, device=device),
                "labels": torch.zeros(8, dtype=torch.long, device=device)}

    label = "(b) BERT (reduced)" if quick else "(b) BERT-base, 8x128, fwd+bwd"
    return _model_step(label, model, inputs, 1)


def resnet_workload(quick: bool) -> Tuple[str, Workload]:
    """(c) ResNetForImageClassification, resnet-50 layout, batch 8x224x224, fwd+bwd."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    config = ResNetConfig(depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], embedding_size=16) if quick else ResNetConfig()
    model = ResNetForImageClassification(config)
    size = 64 if quick else 224
    pixels = torch.randn(8, 3, size, size)

    def inputs(device: str) -> dict:
        return {"pixel_values": pixels.to(device), "labels": torch.zeros(8, dtype=torch.long, device=device)}

    label = "(c) ResNet (reduced)" if quick else "(c) ResNet-50, 8x224², fwd+bwd"
    return _model_step(label, model, inputs, 1)


def gpt2_workload(quick: bool) -> Tuple[str, Workload]:
    """(d) GPT-2 with 2 layers (GPT2LMHeadModel), batch 8x128, fwd+bwd."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=1024) if quick else GPT2Config(n_layer=2)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, config.vocab_size, (8, 128))

    def inputs(device: str) -> dict:
        tokens = ids.to(device)
        return {"input_ids": tokens, "labels": tokens}

    label = "(d) GPT-2 (reduced)" if quick else "(d) GPT-2, 2 layers, 8x128, fwd+bwd"
    return _model_step(label, model, inputs, 1)


def measure_pairs(run: Workload, backend: str, plain_device: str, pairs: int) -> Dict[str, List[float]]:
    """Interleaved activated/plain timings of ``run``; the order alternates pair by pair."""
    active, plain, ratios = [], [], []
    for i in range(pairs):
        order = ("active", "plain") if i % 2 == 0 else ("plain", "active")
        times = {}
        for side in order:
            if side == "active":
                ft.init_backend(backend)
                try:
                    times[side] = run("cuda")
                finally:
                    ft.deactivate()
            else:
                times[side] = run(plain_device)
        active.append(times["active"])
        plain.append(times["plain"])
        ratios.append(times["active"] / times["plain"])
    return {"active": active, "plain": plain, "ratio": ratios}


def _fresh_seconds(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def startup_costs(backend: str, runs: int) -> Dict[str, float]:
    """Median ms, each in a fresh interpreter, of ``import torch``, of ``import flagos_torchfl``
    right after it, and of the first activation; and of a warm activation in this process."""
    timed = "import time{pre}; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
    plain, package, first_activation = [], [], []
    for _ in range(runs):
        plain.append(_fresh_seconds(timed.format(pre="", stmt="import torch")))
        package.append(_fresh_seconds(timed.format(pre=", torch", stmt="import flagos_torchfl")))
        first_activation.append(_fresh_seconds(
            timed.format(pre=", torch, flagos_torchfl as ft", stmt=f"ft.init_backend({backend!r})")))
    warm = []
    for _ in range(runs):
        start = time.perf_counter()
        ft.init_backend(backend)
        warm.append(time.perf_counter() - start)
        ft.deactivate()
    return {
        "import torch (ms)": 1000 * statistics.median(plain),
        "import flagos_torchfl after torch (ms)": 1000 * statistics.median(package),
        "first activation, fresh process (ms)": 1000 * statistics.median(first_activation),
        "activation, warm (ms)": 1000 * statistics.median(warm),
    }


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 pairs, reduced models")
    parser.add_argument("--pairs", type=int, default=None, help="interleaved pairs (default 11, quick 3)")
    parser.add_argument("--backend", default=None, help="backend to activate (default: auto-selected)")
    parser.add_argument("--only", default="abcd",
                        help="workloads to run, e.g. 'ad' (default abcd; '' for the start-up costs alone)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: 1 on the CPU backend, torch's own elsewhere)")
    args = parser.parse_args(argv)
    pairs = args.pairs or (3 if args.quick else 11)
    if pairs < 1:
        parser.error("--pairs must be at least 1")

    selection = ft.init_backend(args.backend)
    backend, device_type = selection.backend, selection.device_type
    ft.deactivate()
    plain_device = "cpu" if device_type == "cpu" else f"{device_type}:{selection.devices[0]}"
    threads = args.threads or (1 if device_type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    print(f"# redirect overhead: backend {backend} (plain device {plain_device}), {pairs} pairs"
          f"{', quick' if args.quick else ''}")
    print(f"# torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f} at start")

    builders = {"a": lambda: mlp_workload(50 if args.quick else 200), "b": lambda: bert_workload(args.quick),
                "c": lambda: resnet_workload(args.quick), "d": lambda: gpt2_workload(args.quick)}
    rows = []
    for key in args.only:
        if key not in builders:
            parser.error(f"--only takes letters of 'abcd'; got {key!r}")
        name, run = builders[key]()
        measure_pairs(run, backend, plain_device, 1)  # warm-up of both sides
        result = measure_pairs(run, backend, plain_device, pairs)
        target = 1.03 if key == "a" else 1.01
        ratio = statistics.median(result["ratio"])
        rows.append((name, statistics.median(result["plain"]), statistics.median(result["active"]), ratio,
                     min(result["ratio"]), max(result["ratio"]), target))
        print(f"# done: {name}", flush=True)

    costs = startup_costs(backend, 3 if args.quick else 7)
    print()
    print("| workload | plain (s) | activated (s) | median ratio | spread (min–max) | target |")
    print("|---|---|---|---|---|---|")
    for name, plain, active, ratio, low, high, target in rows:
        verdict = "met" if ratio <= target else "missed"
        print(f"| {name} | {plain:.4f} | {active:.4f} | {ratio:.3f} | {low:.3f}–{high:.3f} | ≤ {target:.2f} ({verdict}) |")
    print()
    print("| start-up cost | ms | target |")
    print("|---|---|---|")
    for label, value in costs.items():
        target = "< 50" if "flagos_torchfl" in label or "first activation" in label else ""
        print(f"| {label} | {value:.1f} | {target} |")
    print(f"\n# load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
