"""A transformers GPT-2 (tiny config, random weights) trains 20 steps under bfloat16 autocast on
the CPU and on the sim: finite, decreasing losses, and every module's output in the same dtype on
both when both use CUDA's operator lists (on the CPU registered over PyTorch's CPU lists, which
differ: e.g. CUDA runs ``pow`` in float32, the CPU list leaves it alone)."""
from __future__ import annotations

import math

import pytest
import torch

from tests.precision.dtypes import train_tiny_gpt2

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


def train(device: str, steps: int = 20):
    return train_tiny_gpt2(device, steps, torch.bfloat16)


@pytest.fixture(scope="module")
def runs():
    from flagos_torchfl.precision import register_autocast_rules
    from tests.routing.simutil import start_sim
    start_sim()
    sim_rules = register_autocast_rules("sim")
    cpu_plain = train("cpu")
    cpu_rules = register_autocast_rules("cpu", "AutocastCPU", replace=True)
    try:
        cpu_cuda_lists = train("cpu")
    finally:
        cpu_rules()
    sim = train("sim")
    sim_rules()
    return {"cpu": cpu_plain, "cpu_cuda_lists": cpu_cuda_lists, "sim": sim}


@pytest.mark.parametrize("run", ["cpu", "cpu_cuda_lists", "sim"])
def test_loss_finite_and_decreasing(runs, run):
    losses, dtypes = runs[run]
    assert len(losses) == 20 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.75 * losses[0]
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 18
    assert dtypes["transformer.h.0.attn.c_attn"] == (torch.bfloat16,)  # really mixed


def test_same_dtype_per_module_on_cpu_and_sim(runs):
    sim, cpu = runs["sim"][1], runs["cpu_cuda_lists"][1]
    assert sim.keys() == cpu.keys()
    assert {k: v for k, v in sim.items() if cpu[k] != v} == {}
    # With PyTorch's own CPU lists only the operators the lists disagree on differ.
    plain = runs["cpu"][1]
    differing = {k for k in sim if plain[k] != sim[k]}
    assert differing and all(k.endswith(".mlp.act") for k in differing), differing
