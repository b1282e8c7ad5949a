"""The torch.cuda facade on the CPU backend: every served answer, and clear errors for the rest."""
from __future__ import annotations

import json
import textwrap
import time

import pytest
import torch

import flagos_torchfl as ft

from flagos_torchfl.errors import UnsupportedFeatureError
from flagos_torchfl.redirect import DeviceOrdinalError
from flagos_torchfl.inline import InlineEvent, InlineStream
from tests.helpers import run_python


def test_device_queries(cpu_backend):
    cuda = torch.cuda
    assert cuda.is_available() is True and cuda.is_initialized() is True
    assert cuda.device_count() == 1 and cuda.current_device() == 0
    cuda.set_device(0)
    cuda.set_device("cuda:0")
    with cuda.device(0):
        assert cuda.current_device() == 0
    name = cuda.get_device_name()
    props = cuda.get_device_properties(0)
    assert props.name == name == cuda.get_device_name(0) and props.total_memory > 0
    assert cuda.get_device_capability() == (8, 0) and cuda.is_bf16_supported() is True  # the host computes bfloat16
    assert (props.major, props.minor) == (8, 0)
    cuda.synchronize()
    cuda.synchronize(0)
    cuda.init()
    with pytest.raises(DeviceOrdinalError, match="backend 'cpu' has 1 device"):
        cuda.set_device(1)


def test_device_context_on_two_devices(two_cpu_devices):
    cuda = torch.cuda
    assert cuda.device_count() == 2
    with cuda.device(1):
        assert cuda.current_device() == 1
        with cuda.device(0):
            assert cuda.current_device() == 0
        assert cuda.current_device() == 1
    assert cuda.current_device() == 0
    cuda.set_device(1)
    assert cuda.current_device() == 1
    cuda.set_device(0)


def test_streams_and_events(cpu_backend):
    cuda = torch.cuda
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    assert isinstance(start, InlineEvent)
    start.record()
    time.sleep(0.02)
    end.record()
    end.synchronize()
    assert 15.0 <= start.elapsed_time(end) < 2000.0
    with pytest.raises(RuntimeError, match="recorded"):
        cuda.Event(enable_timing=True).elapsed_time(end)
    with pytest.raises(RuntimeError, match="enable_timing"):  # as CUDA's
        cuda.Event().elapsed_time(end)
    s = cuda.Stream()
    assert isinstance(s, InlineStream) and s.query()
    default = cuda.current_stream()
    assert default is cuda.default_stream()
    with cuda.stream(s):
        assert cuda.current_stream() is s
        s.wait_stream(default)
        ev = s.record_event()
        s.wait_event(ev)
    assert cuda.current_stream() is default
    s.synchronize()


def test_memory_queries(cpu_backend):
    from flagos_torchfl.machine.host import process_memory

    cuda = torch.cuda
    for fn in (cuda.memory_allocated, cuda.memory_reserved, cuda.memory_cached):
        assert abs(fn() - process_memory()[0]) < 16 << 20 and fn(0) > 50 << 20  # resident memory
    for fn in (cuda.max_memory_allocated, cuda.max_memory_reserved):
        assert fn() >= cuda.memory_allocated() > 0
    cuda.reset_peak_memory_stats()
    cuda.reset_max_memory_allocated()
    cuda.empty_cache()
    cuda.ipc_collect()
    free, total = cuda.mem_get_info()
    assert 0 < free <= total
    assert set(cuda.memory_stats()) == {f"{n}.all.{f}" for n in ("allocated_bytes", "reserved_bytes")
                                        for f in ("current", "peak")}
    assert cuda.memory_snapshot() == []
    assert "no device pool; process resident memory" in cuda.memory_summary()
    assert cuda.memory.memory_allocated() > 0
    with pytest.raises(UnsupportedFeatureError, match=r"torch.cuda.memory._record_memory_history .*'cpu'"):
        cuda.memory._record_memory_history()


def test_seeding_uses_the_backend_generator(cpu_backend):
    torch.cuda.manual_seed(7)
    a = torch.rand(3, device="cuda")
    torch.manual_seed(7)
    assert torch.equal(a, torch.rand(3))
    torch.cuda.manual_seed_all(8)
    assert torch.cuda.initial_seed() == 8
    state = torch.cuda.get_rng_state()
    b = torch.rand(2)
    torch.cuda.set_rng_state(state)
    assert torch.equal(b, torch.rand(2))
    states = torch.cuda.get_rng_state_all()
    c = torch.rand(2)
    torch.cuda.set_rng_state_all(states)
    assert torch.equal(c, torch.rand(2))
    assert torch.cuda.default_generators == (torch.default_generator,)
    before = torch.get_rng_state()
    with torch.random.fork_rng(device_type="cuda"):
        torch.rand(5)
    assert torch.equal(before, torch.get_rng_state())



def test_nvtx_and_amp_namespaces(cpu_backend):
    assert torch.cuda.nvtx.range_push("step") == 0
    torch.cuda.nvtx.range_pop()
    with torch.cuda.nvtx.range("block"):
        pass
    torch.cuda.nvtx.mark("x")
    assert torch.cuda.amp is __import__("torch.cuda.amp").cuda.amp
    assert isinstance(torch.cuda.current_stream(), torch.cuda.Stream)
    assert isinstance(torch.cuda.stream(None), torch.cuda.StreamContext)
    from torch.cuda import nvtx

    nvtx.range_push("from-import")


#: unserved names and arguments that fit each one's signature
UNSERVED_CALLS = {"utilization": (), "set_per_process_memory_fraction": (0.5,), "caching_allocator_alloc": (8,)}


@pytest.mark.parametrize("name", sorted(UNSERVED_CALLS))
def test_unserved_attributes_raise_on_use_naming_attribute_and_backend(cpu_backend, name):
    stand_in = getattr(torch.cuda, name)  # naming it (annotations, isinstance) is harmless
    assert not isinstance(torch.zeros(1), stand_in)
    assert stand_in | None is not None
    for use in (lambda: stand_in(*UNSERVED_CALLS[name]), lambda: stand_in.replay):
        with pytest.raises(UnsupportedFeatureError) as info:
            use()
        message = str(info.value)
        assert f"torch.cuda.{name}" in message and "'cpu'" in message
        assert "not compiled with CUDA" not in message
    with pytest.raises(TypeError):  # arguments the real function does not take: CUDA's error first
        stand_in(0, 1, 2, 3, 4, 5, no_such_argument=1)
    assert getattr(torch.cuda, name) is stand_in


def _real_cuda(name):
    import types

    return types.ModuleType.__getattribute__(torch.cuda, name)


@pytest.mark.parametrize("name", ["utilization", "caching_allocator_alloc", "use_mem_pool"])
def test_stand_ins_introspect_as_what_they_stand_for(cpu_backend, name):
    """dynamo reads ``torch.cuda.use_mem_pool.__wrapped__`` at import (torch 2.14), inspect,
    functools.wraps chains and doc tools read the rest."""
    import functools
    import inspect

    ft.deactivate()
    if not hasattr(torch.cuda, name):
        pytest.skip(f"torch {torch.__version__} has no torch.cuda.{name}")
    real = getattr(torch.cuda, name)
    ft.init_backend("cpu")
    stand_in = getattr(torch.cuda, name)
    assert stand_in is not real and _real_cuda(name) is real
    assert stand_in.__wrapped__ is real
    assert inspect.unwrap(stand_in) is inspect.unwrap(real)
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        assert getattr(stand_in, attr) == getattr(real, attr), attr
    assert inspect.signature(stand_in) == inspect.signature(real)

    @functools.wraps(stand_in)
    def user_wrapper(*args, **kwargs):
        return stand_in(*args, **kwargs)

    assert inspect.unwrap(user_wrapper) is inspect.unwrap(real)
    assert user_wrapper.__name__ == real.__name__
    with pytest.raises(UnsupportedFeatureError, match=f"torch.cuda.{name} is not available on backend 'cpu'"):
        user_wrapper(*{**UNSERVED_CALLS, "use_mem_pool": (None,)}[name])


def test_submodule_stand_ins_introspect_as_the_real_submodule(cpu_backend):
    import inspect

    ft.deactivate()
    real_module = torch.cuda.memory
    real = real_module.caching_allocator_alloc
    ft.init_backend("cpu")
    assert torch.cuda.memory.__doc__ == real_module.__doc__
    stand_in = torch.cuda.memory.caching_allocator_alloc
    assert stand_in.__wrapped__ is real and inspect.signature(stand_in) == inspect.signature(real)
    assert torch.cuda.Stream.__wrapped__ is type(torch.cuda.current_stream())
    assert torch.cuda.Stream.__name__ == type(torch.cuda.current_stream()).__name__


@pytest.mark.full
def test_dynamo_imports_and_optimizers_step_under_the_facade():
    """A fresh process: the first optimizer step imports torch._dynamo while the facade is active
    (torch 2.14's dynamo reads ``__wrapped__`` of torch.cuda names; AdamW asks
    ``torch.accelerator.current_accelerator(check_available=True)``)."""
    from tests.helpers import run_python

    code = ("import flagos_torchfl as ft, torch, sys; ft.init_backend('cpu')\n"
            "from flagos_torchfl.compat import parse_version\n"  # torch 2.1 imports dynamo with torch
            "assert 'torch._dynamo' not in sys.modules or parse_version(torch.__version__) < (2, 2)\n"
            "m = torch.nn.Linear(3, 1).cuda(); o = torch.optim.AdamW(m.parameters())\n"
            "m(torch.randn(2, 3, device='cuda')).sum().backward(); o.step()\n"
            "import torch._dynamo\n"
            "print('ok', torch.accelerator.current_accelerator(check_available=True)"
            " if hasattr(torch, 'accelerator') else None)\n")
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok", "None"]


def test_backends_flags_are_harmless(cpu_backend):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_flash_sdp(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with pytest.raises(UnsupportedFeatureError, match="torch.backends.cuda.cufft_plan_cache .*'cpu'"):
        torch.backends.cuda.cufft_plan_cache.size


@pytest.mark.torch_feature("accelerator")
def test_accelerator_stays_truthful(cpu_backend):
    """As without this package on the same torch (a CUDA build's device module stays torch.cuda)."""
    ft.deactivate()
    plain = (torch.accelerator.is_available(), torch.accelerator.current_accelerator(),
             torch.get_device_module(), torch.accelerator.device_count())
    ft.init_backend("cpu")
    assert torch.accelerator.is_available() is False and torch.accelerator.device_count() == 0
    assert (torch.accelerator.is_available(), torch.accelerator.current_accelerator(),
            torch.get_device_module(), torch.accelerator.device_count()) == plain
    assert torch.cuda.device_count() == 1  # the facade's own answer: the backend's devices
    assert torch.get_device_module("cuda") is torch.cuda
    assert torch.OutOfMemoryError is torch.cuda.OutOfMemoryError


@pytest.mark.torch_feature("accelerator")
def test_torch_accelerators_questions_get_the_real_modules_answers(cpu_backend):
    """``torch.accelerator`` asks ``torch.get_device_module("cuda")`` on a CUDA build: inside
    its questions the facade answers as the real module; around them, for the backend."""
    from flagos_torchfl import redirect
    from flagos_torchfl.redirect.cuda_facade import asked_by_torch_accelerator

    assert torch.cuda.is_available() is True and torch.cuda.device_count() == 1
    with asked_by_torch_accelerator:
        assert torch.cuda.is_available() is False  # no GPU on this machine, whatever the build
        assert torch.cuda.device_count() == 0
        with asked_by_torch_accelerator:
            assert torch.cuda.device_count() == 0
        assert torch.cuda.device_count() == 0
    assert torch.cuda.is_available() is True and torch.cuda.device_count() == 1
    # the patch wraps torch.accelerator's two questions where the build's accelerator is CUDA
    assert "accelerator_asks_real_cuda" in redirect.active_patches()
    built_for = torch.accelerator.current_accelerator()
    for question in (torch.accelerator.is_available, torch.accelerator.device_count):
        wrappers = []
        while hasattr(question, "__wrapped__"):
            wrappers.append(question.__code__.co_name)
            question = question.__wrapped__
        assert ("truthful" in wrappers) == (built_for is not None and built_for.type == "cuda"), wrappers


def test_private_plumbing_reaches_real_module(cpu_backend):
    assert torch.cuda._is_compiled is _real_cuda("_is_compiled")
    assert torch.cuda._is_compiled() is hasattr(torch._C, "_cuda_getDeviceCount")  # the build's answer
    assert callable(torch.cuda._lazy_init)


@pytest.mark.full
@pytest.mark.needs_sim
def test_the_uses_of_missing_names_belong_to_one_activation():
    # a sim profile renames the device type for the process: in a child of its own
    code = textwrap.dedent("""
        import json, torch
        import flagos_torchfl as ft
        from flagos_torchfl.tables.device_modules import missing_uses

        def use():
            try:
                torch.cuda.list_gpu_processes()
            except ft.UnsupportedFeatureError:
                pass

        ft.init_backend("sim")
        use(); use()
        first = missing_uses.rows("ascend")
        ft.deactivate()
        after = missing_uses.rows("ascend")
        ft.init_backend("sim")
        again = missing_uses.rows("ascend")
        use()
        print(json.dumps([first, after, again, missing_uses.rows("ascend")]))
    """)
    proc = run_python(["-c", code], env={"FL_SIM_PROFILE": "ascend"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, after, again, last = json.loads(proc.stdout.splitlines()[-1])
    assert first == [["list_gpu_processes", 2]] and after == [] and again == [] and last == [["list_gpu_processes", 1]]


@pytest.mark.torch_feature("accelerator")
def test_only_the_program_s_own_accelerator_questions_earn_the_hint(cpu_backend):
    """``torch._utils._get_available_device_type()`` (torchtitan, DCP) is answered through the
    package's own question to ``torch.accelerator``: no hint at exit for it."""
    import torch._utils

    from flagos_torchfl.redirect import accelerator

    accelerator._watch.pop("asked", None)  # what earlier tests asked
    try:
        assert torch._utils._get_available_device_type() == "cuda"
        assert accelerator.hint() is None
        assert torch.accelerator.device_count() == 0  # the program asks, and finds none
        assert "asked torch.accelerator" in accelerator.hint()
    finally:
        accelerator._watch.pop("asked", None)
