"""The profiler asked for CUDA on the sim (PrivateUse1, so this module runs in an interpreter of
its own): the sim's activity and device, device time from its profiler stubs, device memory
reported by its C++ runtime, nothing printed by torch's C++ side; the program through the
launcher on the sim and the Ascend profile."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.profiler import ProfilerActivity

from tests.helpers import run_python
from tests.redirect.test_profiler_cpu import PROGRAM, failure_lines, legacy_spellings, matmul

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.mark.parametrize("asked", legacy_spellings(), ids=lambda a: next(iter(a)))
def test_legacy_profiler_times_operators_on_the_sim(sim_backend, capfd, asked):
    matmul(64)  # the devices started outside the profiled region
    with pytest.warns(FutureWarning) if "use_cuda" in asked else contextlib.nullcontext():
        with torch.autograd.profiler.profile(**asked) as prof:
            matmul(64)
    assert prof.use_device == "sim"
    mm = next(e for e in prof.key_averages() if e.key == "aten::mm")
    assert mm.device_time_total > 0 and mm.self_device_time_total > 0
    assert "SIM" in prof.key_averages().table()
    assert not failure_lines(capfd.readouterr().err)


@pytest.mark.parametrize("activities", [
    [ProfilerActivity.CPU, ProfilerActivity.CUDA], [ProfilerActivity.CUDA],
], ids=["cpu+cuda", "cuda"])
def test_the_cuda_activity_is_the_sims(sim_backend, capfd, tmp_path, activities):
    with torch.profiler.profile(activities=activities) as prof:
        with torch.profiler.record_function("step"):
            matmul()
    assert ProfilerActivity.PrivateUse1 in prof.activities and ProfilerActivity.CUDA not in prof.activities
    assert prof.profiler.use_device == "sim"
    if ProfilerActivity.CPU in activities:
        assert {"step", "aten::mm"} <= {e.key for e in prof.key_averages()}
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    assert (tmp_path / "trace.json").stat().st_size > 0
    assert not failure_lines(capfd.readouterr().err)


def test_the_cpp_runtime_reports_device_memory_to_the_operators_that_allocate(sim_backend):
    from flagos_torchfl.sim.runtime import state as runtime

    if runtime.cpp_runtime() is None:
        pytest.skip("the sim runs on its Python guard here (no C++ compiler)")
    matmul()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                profile_memory=True) as prof:
        with torch.profiler.record_function("block"):
            kept = [torch.empty(1000, device="sim"), torch.empty(100, device="sim")]  # 4096 + 512
            torch.empty(3000, device="sim")  # 12288 bytes, given back at once
        with torch.profiler.record_function("freed"):
            kept.clear()
    usage = {e.key: e for e in prof.key_averages()}
    assert usage["aten::empty"].self_device_memory_usage == 4096 + 512 + 12288  # the operator allocates
    assert usage["block"].self_device_memory_usage == -12288  # the region itself frees the temporary
    assert usage["block"].device_memory_usage == 4096 + 512
    assert usage["freed"].self_device_memory_usage == -(4096 + 512)
    assert usage["block"].self_cpu_memory_usage == 0
    assert "SIM Mem" in prof.key_averages().table()


def test_emit_nvtx_and_the_capture_range_on_the_sim(sim_backend):
    with torch.autograd.profiler.emit_nvtx():
        value = matmul()
    assert value.device.type == "sim"
    with torch.cuda.profiler.profile():
        matmul()


@pytest.mark.full
@pytest.mark.parametrize("selection", [["--backend", "sim"], ["--profile", "ascend"]], ids=["sim", "ascend"])
def test_cuda_profiling_program_prints_no_failure(tmp_path, selection):
    script = tmp_path / "profile_cuda.py"
    script.write_text(PROGRAM)
    proc = run_python(["-m", "flagos_torchfl", "run", *selection, str(script)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.rstrip().endswith("done")
    assert "Self SIM" in proc.stdout or "Self NPU" in proc.stdout  # device time columns
    assert failure_lines(proc.stderr) == [], proc.stderr[:3000]
