"""Memory-pool settings on the cpu backend: figures that are the process's resident memory (never
a made-up 0), the checked limit, the clear interval releasing the C heap's free pages at the
right optimizer steps, defrag, and the warnings; and the note the launcher adds to an
out-of-memory error (on the cpu, and with the sim, whose limit is exact)."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl import compat
from flagos_torchfl.machine.host import process_memory

MIB = 1 << 20


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in ("FL_MEMORY_VIRTUAL_LIMIT", "FL_MEMORY_POOL_CLEAR_INTERVAL", "FL_MIXED_PRECISION",
                 "FL_BACKEND", "FL_EXPANDABLE_SEGMENTS"):
        monkeypatch.delenv(name, raising=False)
    ft.deactivate()
    yield
    ft.deactivate()


def resident() -> int:
    return process_memory()[0]


def fragment_heap(keep: list, pairs: int = 1000) -> None:
    """Leave ~``pairs`` x 32 KiB free holes in the C heap between live tensors (glibc cannot
    give them back on free; ``malloc_trim`` can)."""
    freed = []
    for _ in range(pairs):
        keep.append(torch.ones(8000))
        freed.append(torch.ones(8000))
    del freed


def test_stats_are_the_process_resident_memory_and_labelled():
    ft.init_backend("cpu")
    stats = ft.memory_stats()
    assert stats.measures == "host process (resident memory)" and stats.backend == "cpu"
    assert stats.cached is None and stats.allocations is None and stats.limit is None
    assert abs(stats.allocated - resident()) < 16 * MIB and stats.allocated == stats.reserved
    assert stats.peak >= stats.allocated > 50 * MIB and stats.total > stats.peak
    summary = ft.memory_summary()
    assert "host process (resident memory)" in summary and "cuda:0" in summary
    assert set(stats.as_dict()) == {"backend", "device", "measures", "allocated", "reserved", "peak",
                                    "cached", "limit", "allocations", "total"}


def test_torch_cuda_counters_follow_a_real_allocation_and_the_peak_resets():
    ft.init_backend("cpu")
    before = torch.cuda.memory_allocated()
    big = torch.ones(32 * MIB // 4)  # 32 MiB, touched
    grown = torch.cuda.memory_allocated()
    assert grown - before > 28 * MIB
    assert torch.cuda.max_memory_allocated() >= grown
    assert torch.cuda.memory_stats()["allocated_bytes.all.peak"] >= grown
    del big
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() < grown - 16 * MIB


def test_limit_is_checked_after_each_optimizer_step(capfd):
    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([param], lr=0.1)
    param.grad = torch.ones(4)
    # a first activation and step load what they load lazily (a CUDA build of torch maps its CUDA
    # libraries at the first optimizer step: ~100 MiB), so the margin below is the test's alone
    ft.init_backend("cpu")
    opt.step()
    ft.deactivate()
    limit = resident() + 96 * MIB
    ft.init_backend("cpu", memory_virtual_limit=limit)
    err = capfd.readouterr().err
    assert "accepted but not applied" not in err
    assert "checked against it after every optimizer step" in err
    assert ft.memory_stats().limit == limit
    opt.step()  # under the limit
    hog = torch.ones(192 * MIB // 4)
    with pytest.raises(compat.out_of_memory_error(), match=r"exceeds memory_virtual_limit .*To fit: lower the batch size"):
        opt.step()
    del hog
    ft.deactivate()
    hog = torch.ones(192 * MIB // 4)
    opt.step()  # the hook left with the backend


def test_clear_interval_trims_the_heap_at_every_third_step(capfd):
    ft.init_backend("cpu", memory_pool_clear_interval=3)
    assert "not applied" not in capfd.readouterr().err
    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([param], lr=0.1)
    keep, drops = [], []
    for step in range(1, 7):
        if step in (1, 4):
            fragment_heap(keep)
        param.grad = torch.ones(4)
        before = resident()
        opt.step()
        drops.append((before - resident()) / MIB)
    assert drops[2] > 15 and drops[5] > 15, drops
    assert all(abs(drops[i]) < 4 for i in (0, 1, 3, 4)), drops
    ft.deactivate()
    fragment_heap(keep)
    before = resident()
    for _ in range(3):
        opt.step()
    assert abs(before - resident()) < 4 * MIB  # the hook is gone


def test_defrag_reports_before_and_after():
    ft.init_backend("cpu")
    keep = []
    fragment_heap(keep)
    (report,) = ft.memory_pool_defrag()
    assert report.before.measures == report.after.measures == "host process (resident memory)"
    assert report.released == report.before.reserved - report.after.reserved > 15 * MIB
    assert abs(report.after.allocated - resident()) < 4 * MIB


def test_no_unapplied_warning_and_mixed_precision_applies(capfd):
    ft.init_backend("cpu", memory_pool_clear_interval=5, enable_mixed_precision=True)
    assert "not applied" not in capfd.readouterr().err
    lin = torch.nn.Linear(4, 3).cuda()
    assert lin(torch.randn(2, 4, device="cuda")).dtype == torch.bfloat16
    ft.deactivate()
    assert lin(torch.randn(2, 4)).dtype == torch.float32


def test_expandable_segments_says_why_it_is_not_applied_on_cpu(monkeypatch, capfd):
    monkeypatch.setenv("FL_EXPANDABLE_SEGMENTS", "1")
    ft.init_backend("cpu")
    assert "FL_EXPANDABLE_SEGMENTS=1 not applied on backend cpu" in capfd.readouterr().err


def test_memory_calls_need_an_active_backend_and_a_valid_device():
    with pytest.raises(RuntimeError, match="no backend is active"):
        ft.memory_stats()
    ft.init_backend("cpu")
    with pytest.raises(ValueError, match="has 1 device"):
        ft.memory_stats(3)
    with pytest.raises(ValueError, match="not a device of backend 'cpu'"):
        ft.memory_stats("meta:0")
    assert ft.memory_stats("cuda:0").device == ft.memory_stats(0).device == 0


@pytest.mark.full
def test_launcher_adds_the_host_figures_and_advice_to_the_cpu_limits_error(tmp_path):
    from tests.cli.launching import launch, write

    write(tmp_path, "step.py", '''
        import torch
        model = torch.nn.Linear(4, 4).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, 4, device="cuda")).sum().backward()
        opt.step()
    ''')
    proc = launch("--backend", "cpu", "step.py", cwd=tmp_path, env={"FL_MEMORY_VIRTUAL_LIMIT": "64MiB"})
    assert proc.returncode == 1
    # torch.OutOfMemoryError, or torch.cuda.OutOfMemoryError (the same class) on a torch before it
    assert "OutOfMemoryError: cpu backend: the process's resident memory" in proc.stderr, proc.stderr
    assert "memory: backend cpu, cuda:0 (host process (resident memory)): " in proc.stderr
    assert "raise memory_virtual_limit (now 64 MiB; FL_MEMORY_VIRTUAL_LIMIT)" in proc.stderr


@pytest.mark.full
@pytest.mark.needs_sim
def test_launcher_adds_the_pool_figures_and_advice_to_an_out_of_memory_error(tmp_path):
    from tests.cli.launching import launch, write

    write(tmp_path, "hog.py", '''
        import torch
        keep = torch.empty(1 << 20, device="cuda")
        torch.empty(4 << 20, device="cuda")
    ''')
    proc = launch("--backend", "sim", "hog.py", cwd=tmp_path,
                  env={"FL_MEMORY_VIRTUAL_LIMIT": "16MiB", "FL_MEMORY_POOL_CLEAR_INTERVAL": "50"})
    assert proc.returncode == 1
    assert "torch.OutOfMemoryError: sim:0 out of memory" in proc.stderr
    assert ("memory: backend sim, cuda:0 (device pool): 4 MiB allocated, 4 MiB reserved, 0 B cached, "
            "peak 4 MiB, limit 16 MiB, total 16 MiB. To fit: lower the batch size") in proc.stderr, proc.stderr
    assert "raise memory_virtual_limit (now 16 MiB; FL_MEMORY_VIRTUAL_LIMIT)" in proc.stderr
    assert "enable_mixed_precision=True (activations in bfloat16)" in proc.stderr
