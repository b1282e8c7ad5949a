"""Memory-pool settings and mixed precision on the sim, through ``ft.init_backend("sim", ...)``:
the limit raises OOM with figures and advice, the clear interval releases segments exactly at
its steps, defrag and stats match the allocator and the live tensors, autocast casts as on CUDA
and the capability answers follow it, and the precision settings act on the device."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl as ft

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
MIB = 1 << 20


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in ("FL_MEMORY_VIRTUAL_LIMIT", "FL_MEMORY_POOL_CLEAR_INTERVAL", "FL_MIXED_PRECISION",
                 "FL_BACKEND", "FL_FP32_OPS", "FL_CHECK_FINITE", "FL_OP_ROUTE"):
        monkeypatch.delenv(name, raising=False)
    ft.deactivate()
    yield
    ft.deactivate()


def test_limit_raises_out_of_memory_with_figures_and_advice(capfd):
    ft.init_backend("sim", memory_virtual_limit="8MiB")
    assert "not applied" not in capfd.readouterr().err
    keep = torch.empty(MIB, device="cuda")  # 4 MiB
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(2 * MIB, device="cuda")  # 8 MiB more
    message = str(info.value)
    assert "memory limit of 8.00 MiB" in message and "4.00 MiB allocated" in message
    assert "To fit: lower the batch size" in message and "memory_virtual_limit" in message
    stats = ft.memory_stats()
    assert stats.limit == 8 * MIB and stats.total == 8 * MIB and stats.allocated == 4 * MIB
    del keep


def test_stats_match_the_live_tensors():
    ft.init_backend("sim")
    base = ft.memory_stats()
    tensors = [torch.empty(n, device="cuda") for n in (1000, 300_000, 5)]  # 4000, 1.2e6, 20 bytes
    stats = ft.memory_stats()
    assert stats.measures == "device pool"
    assert stats.allocated - base.allocated == 4096 + 1_200_128 + 512  # 512-byte blocks
    assert stats.allocations - base.allocations == 3
    assert stats.cached == stats.reserved - stats.allocated and stats.peak >= stats.allocated
    assert stats.allocated == torch.cuda.memory_allocated() == torch.sim.memory_allocated()
    del tensors
    assert ft.memory_stats().allocated == base.allocated


def test_clear_interval_releases_cached_segments_at_its_steps(capfd):
    ft.init_backend("sim", memory_pool_clear_interval=3)
    assert "not applied" not in capfd.readouterr().err
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    released_at = []
    for step in range(1, 8):
        loss = model(torch.randn(512, 256, device="cuda")).square().mean()  # 2 MiB activations
        opt.zero_grad()
        loss.backward()
        del loss
        frees = torch.cuda.memory_stats()["num_device_free"]
        cached_before = ft.memory_stats().cached
        opt.step()
        if torch.cuda.memory_stats()["num_device_free"] > frees:
            released_at.append(step)
            assert ft.memory_stats().cached < cached_before
    assert released_at == [3, 6]
    ft.deactivate()


def test_defrag_reports_what_the_allocator_released():
    ft.init_backend("sim")
    big = [torch.empty(2 * MIB, device="cuda") for _ in range(3)]  # 8 MiB segments
    del big
    (report,) = ft.memory_pool_defrag()
    assert report.before.cached >= 24 * MIB
    assert report.released == report.before.reserved - report.after.reserved >= 24 * MIB
    assert report.after.cached == report.before.cached - report.released
    assert report.after.allocated == report.before.allocated


def test_autocast_casts_as_on_cuda_and_capability_follows_it():
    from flagos_torchfl.aten.dispatcher import autocast_casts
    ft.init_backend("sim")
    assert torch.sim.is_bf16_supported() and torch.cuda.is_bf16_supported()
    assert torch.sim.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    lin = torch.nn.Linear(4, 3).cuda()
    with torch.autocast("cuda", torch.bfloat16):
        out = lin(torch.randn(2, 4, device="cuda"))
        assert out.dtype == torch.bfloat16 and out.device.type == "sim"
        assert torch.softmax(out, -1).dtype == torch.float32
    ft.deactivate()
    assert not autocast_casts("AutocastPrivateUse1")
    assert not torch.sim.is_bf16_supported() and torch.sim.get_amp_supported_dtype() == []


def test_enable_mixed_precision_gives_the_hand_written_twin_losses(capfd):
    from tests.precision.test_auto_mixed import train
    ft.init_backend("sim")
    twin = train("sim", True)
    ft.deactivate()
    ft.init_backend("sim", enable_mixed_precision=True)
    assert "not applied" not in capfd.readouterr().err
    auto = train("sim", False)
    assert twin[1] == torch.bfloat16 and auto == twin


def test_fp32_ops_from_the_environment_and_set_op_precision(monkeypatch):
    from tests.precision.dtypes import InputDtypes
    monkeypatch.setenv("FL_FP32_OPS", "gelu")
    ft.init_backend("sim")
    lin = torch.nn.Linear(8, 8).cuda()
    x = torch.randn(4, 8, device="cuda")

    def inputs(op, fn):
        with torch.autocast("cuda", torch.bfloat16), InputDtypes() as seen:
            fn(lin(x))
        return seen.seen[op]

    assert inputs("aten::gelu", torch.nn.functional.gelu) == [(torch.float32,)]
    assert inputs("aten::silu", torch.nn.functional.silu) == [(torch.bfloat16,)]
    undo = ft.set_op_precision("silu", torch.float32)
    assert inputs("aten::silu", torch.nn.functional.silu) == [(torch.float32,)]
    undo()
    assert inputs("aten::silu", torch.nn.functional.silu) == [(torch.bfloat16,)]
    ft.set_op_precision("silu")
    ft.deactivate()  # undoes it with the backend
    monkeypatch.delenv("FL_FP32_OPS")
    ft.init_backend("sim")
    assert inputs("aten::silu", torch.nn.functional.silu) == [(torch.bfloat16,)]
    assert inputs("aten::gelu", torch.nn.functional.gelu) == [(torch.bfloat16,)]


def test_finite_guard_names_the_operator_and_its_route(monkeypatch):
    from flagos_torchfl.precision import NonFiniteError
    monkeypatch.setenv("FL_CHECK_FINITE", "1")
    monkeypatch.setenv("FL_OP_ROUTE", "exp=cpu")
    ft.init_backend("sim")
    with pytest.raises(NonFiniteError, match=r"aten::exp \(route: fallback\)"):
        torch.full((3,), 20.0, device="cuda", dtype=torch.float16).exp()  # e^20 > fp16 max
    with pytest.raises(NonFiniteError, match=r"aten::mul.Tensor \(route: native\)"):
        torch.full((3,), 300.0, device="cuda", dtype=torch.float16) * 300.0
    ft.check_finite(False)
    assert torch.isinf(torch.full((3,), 20.0, device="cuda", dtype=torch.float16).exp()).all()
    ft.check_finite(True)
    ft.deactivate()  # turns the guard off with the backend
    assert torch.isinf(torch.full((3,), 20.0, dtype=torch.float16).exp()).all()


def test_precision_check_is_public():
    ft.init_backend("sim")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).cuda()
    rows = ft.precision_check(model, torch.randn(4, 8, device="cuda"), autocast_dtype=torch.bfloat16)
    assert rows[0].rel_error > 1e-4 and {r.module for r in rows} == {"", "0", "1", "2"}
    assert next(r for r in rows if r.module == "0").dtype == "bfloat16"
