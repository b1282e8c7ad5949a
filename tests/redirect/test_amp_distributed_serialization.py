"""Autocast and GradScaler mapping, collectives and DDP, and checkpoints with CUDA locations."""
from __future__ import annotations

import os
import types
import warnings

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl import compat
from flagos_torchfl.backends import get_backend
from tests.helpers import chip


def _matmul_dtype():
    return (torch.randn(2, 2) @ torch.randn(2, 2)).dtype


def _float16_autocast_matmul_dtype():
    """float16 where this torch's CPU autocast takes it; else autocast is disabled (float32), with a
    warning, as torch disables autocast("cuda") on a machine without CUDA."""
    return torch.float16 if compat.has("autocast_cpu_float16") else torch.float32


def test_autocast_forms(cpu_backend):
    with torch.autocast("cuda"):
        assert _matmul_dtype() == torch.bfloat16  # the backend's declared low precision
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            assert _matmul_dtype() == _float16_autocast_matmul_dtype()
    disabled = [w for w in caught if "autocast is disabled" in str(w.message)]
    assert len(disabled) == (0 if compat.has("autocast_cpu_float16") else 1), [str(w.message) for w in caught]
    with torch.amp.autocast("cuda", enabled=False):
        assert _matmul_dtype() == torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with torch.cuda.amp.autocast():
            assert _matmul_dtype() == torch.bfloat16
        with torch.cuda.amp.autocast(dtype=torch.float16):
            assert _matmul_dtype() == _float16_autocast_matmul_dtype()

    @torch.autocast("cuda")
    def decorated():
        return _matmul_dtype()

    assert decorated() == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _matmul_dtype() == torch.bfloat16


def test_grad_scaler_forms(cpu_backend):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scalers = [torch.cuda.amp.GradScaler(init_scale=4.0)]
        if compat.has("amp_grad_scaler"):
            scalers += [torch.amp.GradScaler(), torch.amp.GradScaler("cuda"), torch.amp.GradScaler(device="cuda")]
    if compat.has("amp_grad_scaler"):
        assert {s._device for s in scalers} == {"cpu"} and all(s.is_enabled() for s in scalers)
    else:  # CUDA's scaler only, and the CPU has none: disabled with torch's warning, as without the package
        assert not scalers[0].is_enabled()
        assert any("CUDA is not available" in str(w.message) for w in caught)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    scaler = scalers[-1]
    loss = model(torch.ones(3, 2)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() > 0 and not torch.equal(model.weight, before)


def test_translate_backend_strings():
    from flagos_torchfl.redirect.devices import Target
    from flagos_torchfl.redirect.distributed import translate_backend

    t = Target(chip("ascend-like", "meta", "float16", "hccl"), (0,), types.SimpleNamespace())
    assert translate_backend(t, "nccl") == "hccl" and translate_backend(t, "NCCL") == "hccl"
    assert translate_backend(t, "gloo") == "gloo" and translate_backend(t, None) is None
    assert translate_backend(t, "cuda:nccl,cpu:gloo") == "meta:hccl,cpu:gloo"
    cpu = Target(get_backend("cpu"), (0,))
    assert translate_backend(cpu, "cuda:nccl,cpu:gloo") == "cpu:gloo"


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_nccl_process_group_and_ddp(cpu_backend, tmp_path, monkeypatch):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    table = dist.Backend.default_device_backend_map
    assert table["cuda"] == "gloo"
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        assert dist.get_backend() == "gloo"  # truthful: gloo is what runs
        group = dist.new_group([0], backend="nccl")
        t = torch.ones(2, device="cuda")
        dist.all_reduce(t, group=group)
        model = DistributedDataParallel(torch.nn.Linear(2, 2).cuda(0), device_ids=[0], output_device=0)
        model(torch.ones(1, 2, device="cuda")).sum().backward()
        assert model.module.weight.grad is not None
    finally:
        dist.destroy_process_group()


def _save_with_cuda_locations(obj, path):
    """A genuine checkpoint whose storages are tagged ``cuda:0``, as one saved on an NVIDIA GPU
    (the location tag is what torch.save writes for CUDA tensors)."""
    import torch.serialization as serialization

    original = serialization.location_tag
    serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(obj, path)
    finally:
        serialization.location_tag = original


def test_checkpoint_with_cuda_locations(tmp_path, monkeypatch):
    monkeypatch.delenv("FL_BACKEND", raising=False)
    ft.deactivate()
    path = tmp_path / "cuda_ckpt.pt"
    _save_with_cuda_locations({"w": torch.arange(3.0)}, path)
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(path)
    ft.init_backend("cpu")
    try:
        for kwargs in ({}, {"map_location": "cuda"}, {"map_location": "cuda:0"},
                       {"map_location": torch.device("cuda", 0)}, {"map_location": {"cuda:0": "cuda:0"}},
                       {"map_location": {"cuda:1": "cpu"}}, {"map_location": lambda s, loc: None},
                       {"map_location": b"cuda:0"}, {"map_location": "cpu"},
                       {"map_location": lambda s, loc: s}):
            loaded = torch.load(path, **kwargs)
            assert loaded["w"].device == torch.device("cpu") and loaded["w"].tolist() == [0.0, 1.0, 2.0], kwargs
        # the file path contains "cuda" and is left alone
        assert os.path.basename(str(path)) == "cuda_ckpt.pt"
        torch.save({"w": torch.ones(1, device="cuda")}, tmp_path / "again.pt")
        assert torch.load(tmp_path / "again.pt", map_location="cuda:0")["w"].device.type == "cpu"
    finally:
        ft.deactivate()
