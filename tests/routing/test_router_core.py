"""Routing on the sim with its default native set (Core ATen plus runtime primitives)."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl.errors import OperatorNotSupportedError

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
aten = torch.ops.aten


@pytest.fixture(scope="module")
def router():
    from tests.routing.simutil import start_sim

    router, undo = start_sim()
    yield router
    undo()


def host(t):
    return t.detach().cpu()


def test_router_registers_nothing_on_native_operators(router):
    native = router.policy.native
    assert len(native) > 300
    assert router.uses_fallback and torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.PrivateUse1)
    assert not set(router.registered) & native
    # what it does register: the composite stubs PrivateUse1's convolution/attention arrive as
    assert "aten::convolution_overrideable" in router.registered
    before = (router.decisions, len(router.stats.rows()))
    x = torch.randn(4, 5, device="sim")
    (x + x).relu().sum().item()
    assert (router.decisions, len(router.stats.rows())) == before


def test_composite_is_decided_once_and_cached(router):
    x = torch.randn(6, 7)
    xd = x.to("sim")
    start = router.decisions
    first = torch.nn.functional.silu(xd)
    assert router.decisions == start + 1
    decision = router.decision_for(aten.silu.out)
    assert decision.route == "composite" and "torch._decomp" in decision.detail
    second = torch.nn.functional.silu(xd)
    assert router.decisions == start + 1  # the second call did not decide again
    torch.testing.assert_close(host(first), torch.nn.functional.silu(x))
    torch.testing.assert_close(host(second), host(first))
    row = {r["op"]: r for r in ft.routing_report()}["aten::silu.out"]
    assert row["route"] == "composite" and row["calls"] == 2 and row["host_bytes"] == 0


def test_decisions_are_per_dtype_and_mode(router):
    x = torch.randn(5, dtype=torch.float64, device="sim")
    start = router.decisions
    torch.nn.functional.hardswish(x)
    torch.nn.functional.hardswish(x.float())
    assert router.decisions == start + 2
    assert router.decision_for(aten.hardswish.default, (torch.float64,)).route == "composite"
    w = torch.randn(5, device="sim", requires_grad=True)
    y = torch.nn.functional.hardswish(w)
    assert router.decisions == start + 3
    assert router.decision_for(aten.hardswish.default, (torch.float32,), training=True) is not None
    y.sum().backward()
    leaf = host(w).requires_grad_()
    torch.nn.functional.hardswish(leaf).sum().backward()
    torch.testing.assert_close(host(w.grad), leaf.grad)


def test_fallback_functional_inplace_and_out(router):
    b1, b2, x = torch.randn(3, 4, 5), torch.randn(3, 5, 6), torch.randn(4, 6)
    d1, d2, dx = b1.to("sim"), b2.to("sim"), x.to("sim")
    torch.testing.assert_close(host(torch.addbmm(dx, d1, d2)), torch.addbmm(x, b1, b2))
    decision = router.decision_for(aten.addbmm.default)
    assert decision.route == "fallback"
    assert [r for r, _ in decision.tried] == ["library", "composite"]
    # in place into a non-contiguous view of a bigger tensor: written through, same object back
    big = torch.zeros(6, 8)
    dbig = big.to("sim")
    view = dbig[1:5, 1:7]
    returned = view.addbmm_(d1, d2)
    assert returned is view
    big[1:5, 1:7].addbmm_(b1, b2)
    torch.testing.assert_close(host(dbig), big)
    # out= with a wrong-sized output: resized, written, returned
    out = torch.empty(0, device="sim")
    assert torch.addbmm(dx, d1, d2, out=out) is out
    torch.testing.assert_close(host(out), torch.addbmm(x, b1, b2))
    row = {r["op"]: r for r in ft.routing_report()}["aten::addbmm"]
    assert row["host_bytes"] > 0


def test_fallback_view_is_a_view_of_the_device_tensor(router):
    x = torch.arange(12.0)
    dx = x.to("sim")
    windows = dx.unfold(0, 4, 2)
    assert router.decision_for(aten.unfold.default).route == "fallback"
    torch.testing.assert_close(host(windows), x.unfold(0, 4, 2))
    windows.mul_(0)  # writes through the view into dx, as on the CPU
    x.unfold(0, 4, 2).mul_(0)
    torch.testing.assert_close(host(dx), x)


def test_fallback_out_takes_the_kernels_layout(router):
    # linalg_lstsq's solution is a narrow of a column-major buffer on the CPU as on a device; a
    # device tensor given another layout makes the backward's matmuls round differently
    a, b = torch.randn(4, 3, generator=torch.Generator().manual_seed(2)), torch.randn(4, 3)
    grads = []
    for device in ("cpu", "sim"):
        da, db = a.to(device).requires_grad_(), b.to(device).requires_grad_()
        solution = torch.linalg.lstsq(da, db, driver="gels").solution
        grads.append([solution.stride(), *(host(g) for g in torch.autograd.grad(solution, (da, db), torch.ones_like(solution)))])
    assert {r["op"]: r for r in ft.routing_report()}["aten::linalg_lstsq.out"]["route"] == "fallback"
    assert grads[1][0] == grads[0][0] == (1, 4)
    for got, expected in zip(grads[1][1:], grads[0][1:]):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_view_as_complex_is_a_composite_view(router, tmp_path):
    x = torch.randn(3, 2)
    dx = x.to("sim")
    z = torch.view_as_complex(dx)
    assert router.decision_for(aten.view_as_complex.default).route == "composite"
    torch.testing.assert_close(host(z), torch.view_as_complex(x))
    z.mul_(2)  # a view: writes reach dx
    torch.testing.assert_close(host(dx), x * 2)
    # forced onto the CPU fallback, a dtype-changing view cannot be rebuilt: a clear error
    config = tmp_path / "routes.json"
    config.write_text('{"routes": {"view_as_complex": "cpu"}}')
    ft.load_routing_config(config)
    try:
        with pytest.raises(OperatorNotSupportedError, match=r"(?s)view_as_complex.*'sim'.*another dtype"):
            torch.view_as_complex(dx)
    finally:
        config.write_text('{"routes": {}}')
        ft.load_routing_config(config)


def test_unsupported_names_operator_backend_and_routes(router):
    x = torch.randn(1, 1, 4, 4, device="sim")
    w = torch.randn(1, 1, 3, 3, device="sim")
    for _ in range(2):  # the second call raises from the cached decision
        with pytest.raises(OperatorNotSupportedError) as info:
            aten.cudnn_convolution(x, w, [0, 0], [1, 1], [1, 1], 1, False, False, False)
    err = info.value
    assert isinstance(err, NotImplementedError)
    assert err.op == "aten::cudnn_convolution" and err.backend == "sim"
    assert [route for route, _ in err.tried] == ["library", "composite", "fallback"]
    assert "the CPU has no kernel" in str(err)


def test_convolution_forward_and_backward(router):
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    dx, dw, db = (t.to("sim").requires_grad_() for t in (x, w, b))
    out = torch.nn.functional.conv2d(dx, dw, db, padding=1)
    out.square().sum().backward()
    cx, cw, cb = (t.clone().requires_grad_() for t in (x, w, b))
    ref = torch.nn.functional.conv2d(cx, cw, cb, padding=1)
    ref.square().sum().backward()
    torch.testing.assert_close(host(out), ref.detach())
    for d, c in ((dx, cx), (dw, cw), (db, cb)):
        torch.testing.assert_close(host(d.grad), c.grad)


def test_first_route_is_logged_once_at_info(router, capfd):
    import logging

    logger = logging.getLogger("flagos_torchfl")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        x = torch.randn(8, device="sim")
        for _ in range(3):
            torch.nn.functional.hardsigmoid(x)
            torch.histc(x, bins=4)
    finally:
        logger.setLevel(level)
    err = capfd.readouterr().err
    assert err.count("[composite-op] aten::hardsigmoid.out") == 1
    assert err.count("[cpu-fallback] aten::histc") == 1


def test_report_orders_by_time_and_renders(router):
    from flagos_torchfl.routing import report

    rows = ft.routing_report()
    assert rows and [r["total_ms"] for r in rows] == sorted((r["total_ms"] for r in rows), reverse=True)
    assert set(rows[0]) >= {"op", "route", "calls", "total_ms", "host_bytes", "dtypes"}
    text = report.render()
    assert text.startswith("routing report for sim (PrivateUse1")
    assert "aten::silu.out" in text and "total by route:" in text


def test_lstm_runs_through_the_fused_cell_composites(router):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 5, num_layers=2)
    x = torch.randn(7, 3, 6)
    out, (h, c) = lstm(x)
    (out.square().mean() + h.sum() + c.sum()).backward()
    expected = [out, h, c] + [p.grad for p in lstm.parameters()]
    lstm.zero_grad()
    lstm.to("sim")
    out, (h, c) = lstm(x.to("sim"))
    (out.square().mean() + h.sum() + c.sum()).backward()
    got = [out, h, c] + [p.grad for p in lstm.parameters()]
    for g, e in zip(got, expected):
        torch.testing.assert_close(host(g), e)
    routes = {r["op"]: r["route"] for r in ft.routing_report()}
    assert routes["aten::_thnn_fused_lstm_cell"] == "composite"
    assert routes["aten::_thnn_fused_lstm_cell_backward_impl"] == "composite"
