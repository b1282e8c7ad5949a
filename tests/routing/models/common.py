"""Shared by the model scripts: seeded data made on the host then moved with ``.cuda()``, a
3-step training loop, and the losses printed as one JSON line."""
from __future__ import annotations

import json
import os

import torch

STEPS = 3
#: "small" (fast test configs) or "base" (bert-base / resnet-50 / gpt-2 sizes)
SIZE = os.environ.get("FL_MODEL_SIZE", "small")


def host_randint(high: int, shape) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(1))


def host_randn(shape) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(2))


def train(model, batch: dict) -> None:
    """Train ``model`` (on CUDA) for STEPS AdamW steps on ``batch``; print the losses."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(STEPS):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    print("LOSSES " + json.dumps(losses), flush=True)
