"""A composite stands for the operator it replaces: the operator's own argument checks hold on
every call (also once a first call has cached the route), and a composite of low-precision
tensors computes as the device kernel does (in float32, rounded once)."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl as ft
from tests.routing.simutil import decision

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def router():
    ft.deactivate()
    ft.init_backend("sim")
    from flagos_torchfl.routing import active_router

    yield active_router()
    ft.deactivate()


def _error(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the error itself is compared
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_index_fill_refuses_a_complex_value_after_a_cached_route(router, dtype):
    def call(device, value):
        x = torch.zeros(3, 4, dtype=dtype, device=device)
        return x.index_fill_(1, torch.tensor([0, 2], device=device), value)

    assert call("sim", 0).cpu().tolist() == call("cpu", 0).tolist()
    assert decision(router, "index_fill_", dtype).route == "composite"
    expected = _error(lambda: call("cpu", 1 + 1j))
    assert expected is not None and "Converting complex Scalar" in expected[1]
    assert _error(lambda: call("sim", 1 + 1j)) == expected
    assert _error(lambda: call("sim", 1 + 1j)) == expected  # every call, not the first only
    assert call("sim", 1).cpu().tolist() == call("cpu", 1).tolist()


def test_adaptive_max_pool_refuses_integers_as_the_cpu_does(router):
    pool = torch.nn.AdaptiveMaxPool2d(2)
    x = torch.arange(48.0).reshape(1, 3, 4, 4)
    torch.testing.assert_close(pool(x.to("sim")).cpu(), pool(x))
    for dtype in (torch.int64, torch.int32):
        expected = _error(lambda: pool(x.to(dtype)))
        assert expected is not None and "not implemented for" in expected[1]
        assert _error(lambda: pool(x.to(dtype).to("sim"))) == expected


def test_a_refused_call_is_not_cached_as_served(router):
    pool = torch.nn.AdaptiveMaxPool2d(2)
    x = torch.ones(1, 1, 4, 4, dtype=torch.int16, device="sim")
    for _ in range(2):
        with pytest.raises(NotImplementedError, match="not implemented for 'Short'"):
            pool(x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_composite_rounds_once_as_the_cpu_kernel(router, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 3, generator=g) * 20).to(dtype)
    src = (torch.randn(40, 3, generator=g) * 20).to(dtype)
    index = torch.randint(0, 5, (40,), generator=g)
    expected = x.index_add(0, index, src)
    got = x.to("sim").index_add(0, index.to("sim"), src.to("sim"))
    assert decision(router, "index_add", dtype).route == "composite"
    assert got.dtype == dtype and torch.equal(got.cpu(), expected)
    inplace = x.to("sim")
    inplace.index_add_(0, index.to("sim"), src.to("sim"))
    assert torch.equal(inplace.cpu(), expected)
    # the CPU kernel adds slice by slice where alpha is not 1 (rounding each time): close only
    scaled = x.to("sim").index_add_(0, index.to("sim"), src.to("sim"), alpha=2)
    torch.testing.assert_close(scaled.cpu(), x.clone().index_add_(0, index, src, alpha=2),
                               rtol=2e-2, atol=1.0)


def test_float32_composite_is_unchanged(router):
    x, src = torch.randn(4, 3), torch.randn(6, 3)
    index = torch.tensor([0, 1, 1, 3, 0, 2])
    got = x.to("sim").index_add(0, index.to("sim"), src.to("sim"))
    torch.testing.assert_close(got.cpu(), x.index_add(0, index, src))
    assert got.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_composite_takes_a_dtype_argument_as_the_kernel(router, dtype, tmp_path):
    """``linalg_vector_norm(x, dtype=<x's low precision>)`` (as ``torch.masked.norm`` calls
    it) routed as a composite: computed in float32 with the ``dtype`` raised alike, rounded once."""
    routes = tmp_path / "routes.json"
    routes.write_text('{"routes": {"linalg_vector_norm": "composite"}}')
    ft.load_routing_config(routes)
    try:
        x = (torch.randn(4, 10, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
        for kwargs in ({"dtype": dtype}, {"dim": 1, "dtype": dtype}, {"ord": 3, "dim": 0, "dtype": dtype}):
            got = torch.linalg.vector_norm(x.to("sim"), **kwargs)
            assert got.dtype == dtype
            torch.testing.assert_close(got.cpu(), torch.linalg.vector_norm(x, **kwargs), rtol=0, atol=0)
        assert decision(router, "linalg_vector_norm", dtype).route == "composite"
    finally:
        routes.write_text('{"routes": {}}')
        ft.load_routing_config(routes)
