"""What real programs exposed on the cpu backend: torch.cuda's own submodules, libraries that
load CUDA kernels, the profiler, autocast queries and custom_fwd, typos, more logical devices."""
from __future__ import annotations


import pytest
import torch

import flagos_torchfl as ft
from tests.helpers import ROOT, prepend_path, run_python


def test_torch_cuda_submodules_are_the_real_ones(cpu_backend):
    import torch.cuda.jiterator
    import torch.cuda.streams

    assert torch.cuda.streams.Stream.__module__ == "torch.cuda.streams"
    fn = torch.cuda.jiterator._create_jit_fn("template <typename T> T f(T x) { return x; }")
    assert callable(fn)  # creating is legal; only running it on a CUDA tensor fails


def test_compile_with_a_string_argument_guards_on_cuda_streams(cpu_backend):
    @torch.compile(backend="eager")
    def scale(x, name):
        return x * 2 if name == "double" else x

    x = torch.ones(3, device="cuda")
    assert torch.equal(scale(x, "double"), torch.full((3,), 2.0))


def test_a_name_torch_cuda_lacks_raises_attribute_error_with_the_closest(cpu_backend):
    with pytest.raises(AttributeError, match="has no attribute 'memory_alocated'. Did you mean 'memory_allocated'"):
        torch.cuda.memory_alocated()
    assert hasattr(torch.cuda, "CUDAGraph") and not hasattr(torch.cuda, "CUDAGraf")
    with pytest.raises(AttributeError):
        torch.cuda.memory.not_a_function


@pytest.mark.full
def test_cuda_kernel_library_stays_on_its_cpu_path():
    env = prepend_path({"FL_CUDA_KERNEL_PACKAGES": "fastkern"}, "PYTHONPATH",
                       ROOT / "tests" / "fixtures" / "cuda_kernel_lib")
    code = ("import torch, flagos_torchfl as ft; ft.auto_select_backend(); import fastkern; "
            "print(fastkern.KERNELS, torch.cuda.is_available())")
    proc = run_python(["-c", code], env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "True"]
    proc = run_python(["-c", code], env={**env, "FL_CUDA_KERNEL_PACKAGES": ""})  # not listed: CUDA path
    assert proc.returncode != 0 and "_cuda_getCurrentRawStream" in proc.stderr


def test_known_cuda_kernel_packages_are_told_the_truth(cpu_backend):
    from flagos_torchfl.redirect import cuda_api

    facade = cuda_api._active["facade"]
    assert {"bitsandbytes", "flash_attn", "xformers", "apex"} <= facade._cuda_kernel_packages
    caller = {"__name__": "bitsandbytes.cuda_setup"}
    assert eval("torch.cuda.is_available()", caller, {"torch": torch}) is False
    assert torch.cuda.is_available() is True


def test_profiler_with_the_cuda_activity_records_host_work_only(cpu_backend, capfd):
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Linear(16, 16).cuda()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            model(torch.randn(4, 16, device="cuda")).sum().backward()
    assert ProfilerActivity.CUDA not in prof.activities
    names = {e.key for e in prof.key_averages()}
    assert "aten::addmm" in names
    assert "CUDA used in profiler" not in capfd.readouterr().err


@pytest.mark.torch_feature("autocast_device_queries")
def test_autocast_queries_and_custom_fwd_see_the_active_autocast(cpu_backend):
    class Scale(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, grad):
            return grad * 2

    x = torch.ones(2, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cuda"):
        assert torch.is_autocast_enabled("cuda") and torch.is_autocast_enabled()
        assert torch.get_autocast_dtype("cuda") == torch.bfloat16
        y = Scale.apply(x)
    assert y.dtype == torch.float32  # cast_inputs applied, as on CUDA
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 2.0, dtype=torch.bfloat16))
    assert not torch.is_autocast_enabled("cuda")


SPAWN = """
import torch, torch.multiprocessing as mp

def worker(rank, world_size):
    x = torch.ones(1, device=f"cuda:{rank}")
    with open(f"rank{rank}.txt", "w") as f:  # a file each: two ranks' prints can interleave
        f.write(f"rank {rank} of {world_size} on {x.device}")

if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(worker, args=(world_size,), nprocs=world_size)
"""


@pytest.mark.full
def test_run_devices_gives_mp_spawn_scripts_their_world_size(tmp_path):
    script = tmp_path / "spawn_workers.py"
    script.write_text(SPAWN)
    proc = run_python(["-m", "flagos_torchfl", "run", "--devices", "2", str(script)], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.read_text() for p in tmp_path.glob("rank*.txt")) == ["rank 0 of 2 on cpu", "rank 1 of 2 on cpu"]


def test_asking_for_a_device_beyond_the_count_says_how_to_get_more(cpu_backend):
    with pytest.raises(ft.DeviceOrdinalError, match="FL_CPU_DEVICES=N.*run --devices N"):
        torch.zeros(1, device="cuda:1")
