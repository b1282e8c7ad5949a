"""``init_backend(..., enable_mixed_precision=True)`` on cpu and sim: a transformers GPT-2 script
with no autocast in it trains 20 steps in bfloat16 mixed precision with finite, decreasing
loss. The cpu backend keeps PyTorch's CPU autocast lists and sim gets CUDA's, so per-module
dtypes agree except where those lists differ (GPT-2's ``gelu_new`` uses ``pow``, which CUDA's
list runs in float32)."""
from __future__ import annotations

import math

import pytest
import torch

import flagos_torchfl as ft

from tests.precision.dtypes import train_tiny_gpt2

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]  # its runs compare sim with cpu


def train(steps: int = 20):
    return train_tiny_gpt2("cuda", steps)


@pytest.fixture(scope="module")
def runs():
    out = {}
    # the sim first: autograd sizes its per-device queues at the first backward
    for backend in ("sim", "cpu"):
        ft.init_backend(backend, enable_mixed_precision=True)
        try:
            out[backend] = train()
        finally:
            ft.deactivate()
    return out


@pytest.mark.parametrize("backend", ["cpu", "sim"])
def test_twenty_steps_finite_and_decreasing_in_bfloat16(runs, backend):
    losses, dtypes = runs[backend]
    assert len(losses) == 20 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.75 * losses[0]
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 18
    assert dtypes["transformer.h.0.attn.c_attn"] == (torch.bfloat16,)
    assert dtypes["transformer.h.0.ln_1"] == (torch.float32,)


def test_dtypes_agree_where_the_lists_agree(runs):
    cpu, sim = runs["cpu"][1], runs["sim"][1]
    assert cpu.keys() == sim.keys()
    differing = {k for k in cpu if cpu[k] != sim[k]}
    assert all(k.endswith(".mlp.act") for k in differing), differing
