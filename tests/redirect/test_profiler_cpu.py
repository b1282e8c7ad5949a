"""The profiler asked for CUDA on the cpu backend: host events only, nothing printed by torch's
C++ side; ``emit_nvtx`` and ``torch.cuda.profiler``'s capture range do nothing and fail nothing."""
from __future__ import annotations

import inspect
import json
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity

import flagos_torchfl as ft
from tests.helpers import run_python

pytestmark = pytest.mark.skipif(
    not __import__("flagos_torchfl").compat.has("library_get_kernel"),
    reason="torch 2.1 lacks what these entry points are (torch.library.get_kernel, torch.get_autocast_dtype, torch.nn.attention, ProfilerActivity.PrivateUse1, Storage.to) or what the tests read")

FAILURES = ("Failed to record", "used in profiler but not enabled", "Exception raised from",
            "INTERNAL ASSERT", "frame #")

PROGRAM = """
import torch
with torch.autograd.profiler.profile(use_device="cuda") as p:
    a = torch.randn(8, 8, device="cuda"); (a @ a).sum()
print(p.key_averages().table())
from torch.profiler import profile, ProfilerActivity, record_function

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as p:
    with record_function("step"):
        a = torch.randn(8, 8, device="cuda"); (a @ a).sum()
print(p.key_averages().table())
with torch.autograd.profiler.emit_nvtx():
    (a @ a).sum()
torch.cuda.profiler.start(); torch.cuda.profiler.stop()
print("done")
"""


def failure_lines(stderr: str) -> list:
    """The lines of ``stderr`` that report a profiler failure in torch's C++ side."""
    return [line for line in stderr.splitlines() if any(f in line for f in FAILURES)]


def matmul(n: int = 8) -> torch.Tensor:
    a = torch.randn(n, n, device="cuda")
    return (a @ a).sum()


def legacy_spellings() -> list:
    """The ways the installed torch's legacy profiler is asked for CUDA."""
    spellings = [{"use_device": "cuda"}]
    if "use_cuda" in inspect.signature(torch.autograd.profiler.profile.__init__).parameters:
        spellings.append({"use_cuda": True})
    return spellings


@pytest.mark.parametrize("asked", legacy_spellings(), ids=lambda a: next(iter(a)))
def test_legacy_profiler_asked_for_cuda_records_host_events(cpu_backend, capfd, asked):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.profiler.profile(**asked) as prof:
            matmul()
    names = {e.key for e in prof.key_averages()}
    assert {"aten::mm", "aten::sum"} <= names
    assert prof.use_device is None and all(e.device_time_total == 0 for e in prof.key_averages())
    assert not failure_lines(capfd.readouterr().err)
    deprecations = [w for w in caught if issubclass(w.category, FutureWarning) and "use_cuda" in str(w.message)]
    assert len(deprecations) == ("use_cuda" in asked)
    assert all(w.filename == __file__ for w in deprecations)  # at the caller, as torch warns


@pytest.mark.parametrize("activities", [
    [ProfilerActivity.CUDA], [ProfilerActivity.CPU, ProfilerActivity.CUDA],
    [{ProfilerActivity.CUDA: ["kernel"]}],
], ids=["cuda", "cpu+cuda", "cuda-filtered"])
def test_the_cuda_activity_is_host_activity(cpu_backend, capfd, activities):
    with torch.profiler.profile(activities=activities) as prof:
        matmul()
    assert prof.activities == {ProfilerActivity.CPU}
    assert "aten::mm" in {e.key for e in prof.key_averages()}
    assert not failure_lines(capfd.readouterr().err)


def test_schedule_loop_writes_traces_with_record_function(cpu_backend, tmp_path, capfd):
    handler = torch.profiler.tensorboard_trace_handler(str(tmp_path))
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                schedule=schedule, on_trace_ready=handler, record_shapes=True) as prof:
        for _ in range(5):
            with torch.profiler.record_function("train_step"):
                matmul()
            prof.step()
    traces = list(tmp_path.glob("*.pt.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert sum(e.get("name") == "train_step" for e in events) == 2
    assert not failure_lines(capfd.readouterr().err)


def test_emit_nvtx_keeps_its_contract_and_records_nothing(cpu_backend):
    with torch.autograd.profiler.emit_nvtx(record_shapes=True) as ranges:
        value = matmul()
    assert isinstance(ranges, torch.autograd.profiler.emit_nvtx) and value.device.type == "cpu"
    with pytest.raises(RuntimeError, match="not reentrant"):
        with ranges:
            pass
    with torch.autograd.profiler.emit_nvtx(enabled=False) as off:
        assert off is None
    with torch.profiler.profile() as prof:  # nothing left enabled
        matmul()
    assert "aten::mm" in {e.key for e in prof.key_averages()}


def test_cuda_profiler_capture_range_opens_nothing(cpu_backend):
    torch.cuda.profiler.start()
    torch.cuda.profiler.stop()
    with torch.cuda.profiler.profile():
        matmul()


def test_deactivate_restores_the_profiler():
    import torch.cuda.profiler as cuda_profiler

    before = (torch.autograd.profiler.emit_nvtx, cuda_profiler.start, cuda_profiler.stop,
              torch.autograd.profiler.profile.__init__, torch.profiler.profiler._KinetoProfile.__init__)
    ft.deactivate()
    ft.init_backend("cpu")
    assert torch.autograd.profiler.emit_nvtx is not before[0] and cuda_profiler.start is not before[1]
    ft.deactivate()
    after = (torch.autograd.profiler.emit_nvtx, cuda_profiler.start, cuda_profiler.stop,
             torch.autograd.profiler.profile.__init__, torch.profiler.profiler._KinetoProfile.__init__)
    assert all(a is b for a, b in zip(after, before))


@pytest.mark.full
def test_cuda_profiling_program_prints_no_failure_on_cpu(tmp_path):
    script = tmp_path / "profile_cuda.py"
    script.write_text(PROGRAM)
    proc = run_python(["-m", "flagos_torchfl", "run", "--backend", "cpu", str(script)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "aten::mm" in proc.stdout and proc.stdout.rstrip().endswith("done")
    assert failure_lines(proc.stderr) == [], proc.stderr[:3000]
