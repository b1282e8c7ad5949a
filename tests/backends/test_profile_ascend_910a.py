"""The Ascend 910A model installed in this process (``FL_SIM_PROFILE=ascend:910a``): a chip without
bfloat16, as torch_npu reports it there. CUDA code that chooses its dtype from
``torch.cuda.is_bf16_supported()`` (nanoGPT's idiom) trains in float16 with a GradScaler; an
explicit bfloat16 autocast is a clear error naming the chip, never a silent change of dtype; the
capability queries say the same."""
from __future__ import annotations

import math
import os
from contextlib import nullcontext

import pytest
import torch

pytestmark = pytest.mark.isolated


@pytest.fixture(scope="module")
def ascend_910a():
    for name in list(os.environ):
        if name.startswith("FL_") or name in ("CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "ASCEND_RT_VISIBLE_DEVICES"):
            del os.environ[name]
    os.environ.update(FL_SIM_PROFILE="ascend:910a")
    import flagos_torchfl as ft

    selection = ft.init_backend("sim")
    yield selection
    ft.deactivate()


def test_the_model_s_traits(ascend_910a):
    assert ascend_910a.chip.name == "sim-ascend" and ascend_910a.chip.model.name == "910a"
    assert torch.cuda.get_device_name(0) == "Ascend910A (flagos sim)"
    assert torch.cuda.get_device_properties(0).total_memory == 32 << 30
    assert torch.npu.is_bf16_supported() is False and torch.cuda.is_bf16_supported() is False
    assert torch.npu.get_amp_supported_dtype() == [torch.float16]


def test_capability_gates_take_the_path_without_bfloat16(ascend_910a):
    assert torch.cuda.get_device_capability() == (7, 0)
    props = torch.cuda.get_device_properties(0)
    assert (props.major, props.minor) == (7, 0)
    assert torch.cuda.is_tf32_supported() is False and torch.cuda.get_arch_list() == []


def test_an_explicit_bfloat16_autocast_names_the_chip(ascend_910a):
    from flagos_torchfl.errors import UnsupportedFeatureError

    with pytest.raises(UnsupportedFeatureError, match=r"Ascend910A \(flagos sim\) \(backend 'sim-ascend'\) "
                                                      r"does not compute bfloat16"):
        torch.autocast("cuda", dtype=torch.bfloat16)
    with pytest.raises(UnsupportedFeatureError, match="does not compute bfloat16"):
        torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=False):  # asks for nothing: no error
        pass
    with torch.autocast("cuda"):  # the chip's own low-precision dtype
        assert torch.get_autocast_dtype("npu") == torch.float16


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=32, width=32, block=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Embedding(block, width)
        self.layer = torch.nn.TransformerEncoderLayer(width, 2, 64, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, idx, targets):
        x = self.embed(idx) + self.position(torch.arange(idx.shape[1], device=idx.device))
        logits = self.head(self.layer(x))
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def test_nanogpt_s_dtype_choice_trains_in_float16_with_a_grad_scaler(ascend_910a):
    # nanoGPT's train.py, as written for CUDA
    device = "cuda"
    dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
    device_type = "cuda" if "cuda" in device else "cpu"
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(1337)
    model = TinyGPT().to(device)
    scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    assert dtype == "float16" and scaler.is_enabled()
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 32, (8, 17), generator=g)
    x, y = data[:, :-1].to(device), data[:, 1:].to(device)
    losses = []
    for _ in range(8):
        with ctx:
            logits, loss = model(x, y)
        assert logits.dtype == torch.float16 and logits.device.type == "npu"
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert next(model.parameters()).dtype == torch.float32 and scaler.get_scale() > 0
