"""What routing costs on the sim, per call and on a real model step.

1. Per call, for one operator (``gelu`` on a small tensor) taken by each route in turn
   (native: the sim's kernel, not intercepted; composite and fallback: forced with a routing
   config), next to what the route does when called by hand (the decomposition run directly;
   the host round trip done directly), so the difference is routing's own cost.
2. The native path with routing installed vs uninstalled (it should cost nothing).
3. A BERT training step (bert-base config, random init) on the sim vs the CPU.

Measurements are interleaved (one block of each variant per round) and the medians reported.
Torch runs one intra-op thread unless ``--threads`` says otherwise (shared machines).

    python benchmarks/routing_overhead.py                 # bert-base at batch 8 x 128
    python benchmarks/routing_overhead.py --quick         # smaller BERT, fewer rounds
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1e3


def interleaved(variants: dict, rounds: int, calls: int, before=None) -> dict:
    """Median µs per call of each variant, measured in interleaved blocks."""
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            if before:
                before(name)
            fn()
            times[name].append(per_call_us(fn, calls))
    return {name: statistics.median(t) for name, t in times.items()}


def route_costs(router, rounds: int, calls: int) -> dict:
    import flagos_torchfl as ft
    from flagos_torchfl.routing import composite, fallback

    aten = torch.ops.aten
    x = torch.randn(64, device="sim")
    decomposition, _ = composite.find(aten.gelu.default)
    configs = {}
    folder = Path(tempfile.mkdtemp())
    for route, spec in (("native", {}), ("composite", {"gelu": "composite"}), ("fallback", {"gelu": "cpu"})):
        configs[route] = folder / f"{route}.json"
        configs[route].write_text(json.dumps({"routes": spec}))

    def by_hand_host():
        return fallback.run(aten.gelu.default, (x,), {}, "sim")

    variants = {
        "native": lambda: torch.nn.functional.gelu(x),
        "composite": lambda: torch.nn.functional.gelu(x),
        "composite by hand": lambda: decomposition(x),
        "fallback": lambda: torch.nn.functional.gelu(x),
        "fallback by hand": by_hand_host,
    }
    route_of = {"native": "native", "composite": "composite", "composite by hand": "native",
                "fallback": "fallback", "fallback by hand": "native"}
    result = interleaved(variants, rounds, calls, before=lambda name: ft.load_routing_config(configs[route_of[name]]))
    ft.load_routing_config(configs["native"])
    return result


def native_tax(router, rounds: int, calls: int) -> dict:
    a, b = torch.randn(32, 32, device="sim"), torch.randn(32, 32, device="sim")

    def state(name):
        installed = bool(router._libs)
        if name == "routing installed" and not installed:
            router.install(router._mechanism)
        if name == "routing uninstalled" and installed:
            router.uninstall()

    step = lambda: torch.relu(a @ b + a)  # noqa: E731  (native ops only)
    result = interleaved({"routing installed": step, "routing uninstalled": step}, rounds, calls, before=state)
    state("routing installed")
    return result


def bert_step_times(batch: int, seq: int, small: bool, rounds: int) -> dict:
    import copy

    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    if small:
        config = BertConfig(num_hidden_layers=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    else:
        config = BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cpu_model = BertForMaskedLM(config)
    sim_model = copy.deepcopy(cpu_model).to("sim")
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    batches = {"cpu": (cpu_model, ids, torch.optim.AdamW(cpu_model.parameters(), lr=1e-4)),
               "sim": (sim_model, ids.to("sim"), torch.optim.AdamW(sim_model.parameters(), lr=1e-4))}

    def step(device):
        model, inputs, optimizer = batches[device]
        start = time.perf_counter()
        loss = model(input_ids=inputs, labels=inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
        return time.perf_counter() - start

    step("cpu"), step("sim")  # warm up (first decisions are made here)
    times = {"cpu": [], "sim": []}
    for _ in range(rounds):
        for device in ("cpu", "sim"):
            times[device].append(step(device))
    return {d: statistics.median(t) for d, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4-layer BERT at 4 x 64, fewer rounds")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from tests.routing.simutil import start_sim

    router, _ = start_sim()
    rounds = 3 if args.quick else args.rounds
    print(f"torch {torch.__version__}, {args.threads} thread(s); medians of {rounds} interleaved rounds")
    costs = route_costs(router, rounds, args.calls)
    print(f"\nper call, gelu on 64 floats on the sim ({args.calls} calls per block):")
    print(f"{'ROUTE':<22}{'US/CALL':>10}")
    for name, us in costs.items():
        print(f"{name:<22}{us:>10.1f}")
    print(f"routing's own cost: composite {costs['composite'] - costs['composite by hand']:+.1f} us, "
          f"fallback {costs['fallback'] - costs['fallback by hand']:+.1f} us per call")
    tax = native_tax(router, rounds, args.calls)
    ratio = tax["routing installed"] / tax["routing uninstalled"]
    print(f"\nnative ops only (relu(a @ b + a), 32x32): installed {tax['routing installed']:.1f} us, "
          f"uninstalled {tax['routing uninstalled']:.1f} us per step, ratio {ratio:.3f}")
    batch, seq = (4, 64) if args.quick else (args.batch, args.seq)
    step = bert_step_times(batch, seq, args.quick, max(3, rounds // 2))
    layers = "4-layer" if args.quick else "bert-base"
    print(f"\nBERT ({layers}, batch {batch}x{seq}) training step, median of {max(3, rounds // 2)}: "
          f"CPU {step['cpu']:.2f} s, sim {step['sim']:.2f} s, sim/CPU {step['sim'] / step['cpu']:.2f}x")
    from flagos_torchfl.routing import report

    print("\n" + "\n".join(report.render().splitlines()[:14]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
