"""precision_check on a transformers BERT (tiny config, random init) on the CPU: rows per module,
largest error first; bfloat16 autocast drifts orders of magnitude more than float32."""
from __future__ import annotations

import math

import pytest
import torch

from flagos_torchfl.precision import precision_check, render


@pytest.fixture(scope="module")
def bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64)
    return transformers.BertModel(config), {"input_ids": torch.randint(0, 100, (2, 16))}


def test_bf16_autocast_rows(bert):
    model, inputs = bert
    model.train()
    rows = precision_check(model, inputs, autocast_dtype=torch.bfloat16)
    assert model.training and all(m.training for m in model.modules())  # modes put back
    names = {r.module for r in rows}
    assert "" in names and "encoder.layer.1.output.dense" in names
    errors = [r.rel_error for r in rows]
    assert errors == sorted(errors, reverse=True)
    dense = next(r for r in rows if r.module == "encoder.layer.0.attention.self.query")
    assert dense.dtype == "bfloat16" and dense.kind == "Linear"
    assert 1e-4 < dense.rel_error < 5e-2 and math.isfinite(dense.max_abs_error)
    fp32 = precision_check(model, inputs)
    assert fp32[0].rel_error < 1e-5 < rows[0].rel_error
    table = render(rows, limit=5)
    assert table.splitlines()[0].startswith("module") and f"{len(rows) - 5} more modules" in table
