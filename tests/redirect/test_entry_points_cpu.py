"""CUDA entry points beyond devices and factories, on the cpu backend: each gives what plain
PyTorch gives (lazy modules), or what CUDA gives for the host (streams, events, storages, the
autocast queries, stream handles, ``is_built``), and argument errors come before feature errors."""
from __future__ import annotations

import warnings

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl import compat
from flagos_torchfl.errors import UnsupportedFeatureError


pytestmark = pytest.mark.skipif(
    not __import__("flagos_torchfl").compat.has("library_get_kernel"),
    reason="torch 2.1 lacks what these entry points are (torch.library.get_kernel, torch.get_autocast_dtype, torch.nn.attention, ProfilerActivity.PrivateUse1, Storage.to) or what the tests read")


def test_lazy_modules_move_and_convert_before_their_first_call(cpu_backend):
    torch.manual_seed(0)
    plain = torch.nn.LazyLinear(4)
    for lazy in (torch.nn.LazyLinear(4).to(torch.float), torch.nn.LazyLinear(4).cuda(),
                 torch.nn.LazyLinear(4).to("cuda", torch.float64)):
        assert isinstance(lazy.weight, torch.nn.parameter.UninitializedParameter)
        x = torch.randn(2, 3, dtype=lazy.weight.dtype, device="cuda")
        assert lazy(x).shape == (2, 4) and lazy.weight.shape == (4, 3)
    assert isinstance(plain.weight, torch.nn.parameter.UninitializedParameter)


def test_uninitialized_parameters_still_refuse_other_operations(cpu_backend):
    lazy = torch.nn.LazyLinear(4).cuda()
    with pytest.raises(ValueError, match="uninitialized parameter"):
        lazy.weight.sum()


@pytest.mark.skipif(not compat.has("stream_event"), reason="torch.Stream / torch.Event need torch>=2.3")
def test_device_generic_streams_and_events_made_for_cuda_are_the_hosts(cpu_backend):
    stream, start, end = torch.Stream(device="cuda"), torch.Event(device="cuda:0", enable_timing=True), \
        torch.Event(device="cuda", enable_timing=True)
    assert isinstance(stream, torch.Stream) and isinstance(start, torch.Event)
    start.record(stream)
    torch.randn(32, 32, device="cuda").sum()
    end.record(stream)
    end.synchronize()
    assert start.query() and start.elapsed_time(end) >= 0
    assert torch.Stream(device="cpu").device_type == torch.Stream(device="cpu").device_type  # untouched
    assert type(torch.Stream(device="cpu")).__name__ == "Stream"


def test_storages_copy_to_the_backend_device(cpu_backend):
    data = torch.arange(6.0)
    untyped = data.untyped_storage().cuda()
    assert untyped.device.type == "cpu" and untyped.nbytes() == 24
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage's deprecation
        typed = data.storage().cuda()
        assert typed.dtype == torch.float32 and typed.tolist() == data.tolist()
        assert data.storage().to(device="cuda:0").device.type == "cpu"
    assert data.untyped_storage().to(device="cuda").device.type == "cpu"


def test_the_deprecated_gpu_autocast_queries_answer_for_the_backend(cpu_backend):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.get_autocast_gpu_dtype() == torch.bfloat16
    before = torch.get_autocast_dtype("cpu")
    try:
        torch.set_autocast_gpu_dtype(torch.float16)
        assert torch.get_autocast_dtype("cpu") == torch.float16 == torch.get_autocast_gpu_dtype()
    finally:
        torch.set_autocast_dtype("cpu", before)


def test_streams_carry_an_integer_handle(cpu_backend):
    assert torch.cuda.current_stream().cuda_stream == 0 == torch.cuda.default_stream().cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        handle = torch.cuda.current_stream().cuda_stream
    assert isinstance(handle, int) and handle == side.cuda_stream != 0


def test_is_built_agrees_with_is_available_for_the_program_and_stays_true_for_torch(cpu_backend):
    assert torch.backends.cuda.is_built() is True and torch.cuda.is_available() is True
    truthful = {}
    exec("answer = is_built()", {"__name__": "torch._inductor.cudagraph_trees",
                                 "is_built": torch.backends.cuda.is_built}, truthful)
    assert truthful["answer"] is torch.backends.cuda.__class__.__mro__[1].__getattribute__(
        torch.backends.cuda, "is_built")()
    ft.deactivate()
    assert torch.backends.cuda.is_built() is torch._C._has_cuda


def test_argument_errors_come_before_feature_errors(cpu_backend):
    with pytest.raises(TypeError, match="cuda_graph"):
        torch.cuda.graph()
    with pytest.raises(TypeError):
        torch.cuda.make_graphed_callables()
    with pytest.raises(TypeError):
        torch.cuda.utilization(0, 1, 2)
    with pytest.raises(UnsupportedFeatureError, match="torch.cuda.utilization"):
        torch.cuda.utilization()


def test_attention_with_every_backend_disabled_is_refused_as_plain_torch_refuses(cpu_backend):
    q = torch.randn(1, 2, 4, 8, device="cuda")
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([]), pytest.raises(RuntimeError, match="No viable backend"):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)


def test_deactivation_restores_what_these_patches_change(cpu_backend):
    mixin = torch.nn.parameter.UninitializedTensorMixin
    ft.deactivate()
    before = (list(mixin._allowed_methods), dict(vars(torch.storage._StorageBase)),
              getattr(torch, "Stream", None), torch.get_autocast_gpu_dtype)
    ft.init_backend("cpu")
    assert len(mixin._allowed_methods) > len(before[0])
    ft.deactivate()
    after = (list(mixin._allowed_methods), dict(vars(torch.storage._StorageBase)),
             getattr(torch, "Stream", None), torch.get_autocast_gpu_dtype)
    assert after == before
