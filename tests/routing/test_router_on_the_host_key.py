"""The router on a torch without the sim (2.1 included): a backend over the host's own dispatch
key (CPU) whose gaps are the operators the CPU has no kernel for (``cudnn_*``, the fused LSTM
cell, ``_fused_dropout``). Registration (per-operator kernels where this torch has no Python
backend fallback, as a vendor chip gets on torch 2.1), decisions and their cache, a kernel
library, composites, the unsupported error, overrides, dtype gaps, the report and the undo run
on real CPU tensors."""
from __future__ import annotations

import json

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl import compat
from flagos_torchfl.errors import OperatorNotSupportedError
from tests.routing.simutil import decision as decision_of

pytestmark = pytest.mark.isolated
aten = torch.ops.aten
BACKEND = "routed-host"
#: the input shape of every call of the kernel library's convolution
library_calls = []


def cudnn_convolution_by_conv2d(x, weight, padding, stride, dilation, groups, benchmark, deterministic,
                                allow_tf32):
    library_calls.append(x.shape)
    return torch.nn.functional.conv2d(x, weight, None, stride, padding, dilation, groups)


@pytest.fixture(scope="module")
def router():
    from flagos_torchfl.backends.cpu import CpuBackend
    from flagos_torchfl.routing.providers import KernelProvider, ProviderKernel, register_provider
    from tests.routing.simutil import start_sim

    class RoutedHost(CpuBackend):
        """The host as a chip that routes what it lacks, without float64 hardsigmoid."""

        name = BACKEND
        aliases = ()
        priority = -1
        routes_operators = True
        dtype_gaps = {"float64": ("aten::hardsigmoid",)}

    class Conv(KernelProvider):
        """A kernel library with cudnn_convolution for float32 only."""

        name = "conv-library"

        def supports(self, backend) -> bool:
            return backend.name == BACKEND

        def kernels(self, backend):
            return [ProviderKernel("aten::cudnn_convolution", cudnn_convolution_by_conv2d,
                                   dtypes=frozenset({torch.float32}))]

    ft.register_backend(RoutedHost)
    register_provider(Conv)
    router, undo = start_sim(backend=BACKEND)
    yield router
    undo()


def lstm_cell(input_gates, hidden_gates, cx):
    i, f, g, o = (input_gates + hidden_gates).chunk(4, 1)
    cy = torch.sigmoid(f) * cx + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(cy), cy


def test_registration_follows_what_this_torch_offers(router):
    from flagos_torchfl.aten import dispatcher

    native = router.policy.native
    assert "aten::add.Tensor" in native and "aten::cudnn_convolution" not in native
    assert router.uses_fallback == compat.has("library_fallback")
    assert not set(router.registered) & native - set(router.policy.dtype_gaps)
    if not router.uses_fallback:  # torch 2.1: one kernel per operator the key lacks
        assert set(dispatcher.routable(native)) <= set(router.registered)
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::cudnn_batch_norm", "CPU")
    assert "aten::convolution_overrideable" in router.registered


def test_native_operators_are_not_intercepted(router):
    before = (router.decisions, len(router.stats.rows()))
    x = torch.randn(4, 5)
    (x + x).relu().sum().item()
    torch.nn.functional.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3))
    assert (router.decisions, len(router.stats.rows())) == before


def test_a_composite_is_decided_once_and_cached(router):
    input_gates, hidden_gates, cx = torch.randn(3, 16), torch.randn(3, 16), torch.randn(3, 4)
    start = router.decisions
    hy, cy, _ = aten._thnn_fused_lstm_cell(input_gates, hidden_gates, cx)
    assert router.decisions == start + 1
    decision = router.decision_for(aten._thnn_fused_lstm_cell.default)
    assert decision.route == "composite" and "LSTM cell" in decision.detail
    again = aten._thnn_fused_lstm_cell(input_gates, hidden_gates, cx)
    assert router.decisions == start + 1
    want_h, want_c = lstm_cell(input_gates, hidden_gates, cx)
    torch.testing.assert_close(hy, want_h)
    torch.testing.assert_close(cy, want_c)
    torch.testing.assert_close(again[0], hy)
    row = {r["op"]: r for r in ft.routing_report()}["aten::_thnn_fused_lstm_cell"]
    assert row["route"] == "composite" and row["calls"] == 2 and row["host_bytes"] == 0


def test_a_decomposition_from_torchs_tables_forward_and_backward(router):
    x = torch.randn(2, 3, 4, 4)
    weight, bias = torch.rand(3) + 0.5, torch.randn(3)
    args = (torch.zeros(3), torch.ones(3), True, 0.1, 1e-5)
    xd, wd, bd = (t.clone().requires_grad_() for t in (x, weight, bias))
    got = aten.cudnn_batch_norm(xd, wd, bd, *args)[0]
    got.square().sum().backward()
    xr, wr, br = (t.clone().requires_grad_() for t in (x, weight, bias))
    want = aten.native_batch_norm(xr, wr, br, *args)[0]
    want.square().sum().backward()
    torch.testing.assert_close(got, want)
    for g, w in ((xd, xr), (wd, wr), (bd, br)):
        torch.testing.assert_close(g.grad, w.grad)
    decision = router.decision_for(aten.cudnn_batch_norm.default, training=True)
    assert decision.route == "composite" and "torch._decomp" in decision.detail
    # its backward (float32 gradients, the uint8 reserve space) is decomposed too
    assert decision_of(router, "cudnn_batch_norm_backward").route == "composite"


def test_a_library_kernel_and_what_it_does_not_serve(router):
    x, w = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    calls = len(library_calls)
    got = aten.cudnn_convolution(x, w, [1, 1], [1, 1], [1, 1], 1, False, False, False)
    assert len(library_calls) == calls + 1
    torch.testing.assert_close(got, torch.nn.functional.conv2d(x, w, padding=1))
    assert router.decision_for(aten.cudnn_convolution.default).route == "library"
    # float64: the library declines, torch has no decomposition, and the host's kernel is the
    # router itself: a clear error naming every route, raised again from the cached decision
    for _ in range(2):
        with pytest.raises(OperatorNotSupportedError) as info:
            aten.cudnn_convolution(x.double(), w.double(), [1, 1], [1, 1], [1, 1], 1, False, False, False)
    err = info.value
    assert err.op == "aten::cudnn_convolution" and err.backend == BACKEND
    tried = dict(err.tried)
    assert list(tried) == ["library", "composite", "fallback"]
    assert "conv-library do not implement it for torch.float64" in tried["library"]
    assert "is routed too" in tried["fallback"]
    assert len(library_calls) == calls + 1


def test_an_override_takes_a_native_operator_off_its_kernel_and_back(router, tmp_path):
    x = torch.randn(7)
    want = torch.nn.functional.hardswish(x)
    config = tmp_path / "routes.json"
    config.write_text(json.dumps({"routes": {"hardswish": "composite"}}))
    ft.load_routing_config(config)
    try:
        assert "aten::hardswish" in router.registered
        torch.testing.assert_close(torch.nn.functional.hardswish(x), want)
        decision = router.decision_for(aten.hardswish.default)
        assert decision.route == "composite" and "sets hardswish=composite" in dict(decision.tried)["override"]
    finally:
        config.write_text('{"routes": {}}')
        ft.load_routing_config(config)
    assert "aten::hardswish" not in router.registered
    before = router.decisions
    torch.testing.assert_close(torch.nn.functional.hardswish(x), want)  # the CPU's own kernel again
    assert router.decisions == before


def test_a_dtype_gap_is_routed(router):
    x = torch.randn(6, dtype=torch.float64)
    want = torch.clamp(x / 6 + 0.5, 0, 1)
    torch.testing.assert_close(torch.nn.functional.hardsigmoid(x), want)
    gap = router.decision_for(aten.hardsigmoid.default, (torch.float64,))
    assert gap.route == "composite"
    assert dict(gap.tried)["native"] == f"{BACKEND} lacks torch.float64 for it"
    before = router.decisions
    torch.testing.assert_close(torch.nn.functional.hardsigmoid(x.float()), want.float())
    native_kept = router.decision_for(aten.hardsigmoid.default, (torch.float32,)) is None
    # where torch cannot call the native kernel from Python, every dtype of a gap is routed
    assert native_kept == compat.has("library_get_kernel")
    if not native_kept:
        assert router.decisions == before + 1
        assert "cannot keep" in dict(router.decision_for(aten.hardsigmoid.default, (torch.float32,)).tried)["native"]


def test_the_first_route_is_logged_once_at_info(router, capfd):
    import logging

    logger = logging.getLogger("flagos_torchfl")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        x = torch.randn(8)
        for _ in range(3):
            out, mask = aten._fused_dropout(x, 1.0)
    finally:
        logger.setLevel(level)
    torch.testing.assert_close(out, x)
    assert bool(mask.all())
    assert capfd.readouterr().err.count("[composite-op] aten::_fused_dropout") == 1


def test_the_report_renders(router):
    from flagos_torchfl.routing import report

    rows = ft.routing_report()
    assert [r["total_ms"] for r in rows] == sorted((r["total_ms"] for r in rows), reverse=True)
    text = report.render()
    assert text.startswith(f"routing report for {BACKEND} (CPU")
    how = "backend fallback" if router.uses_fallback else "per-operator kernels"
    assert how in text.splitlines()[0] and "aten::_thnn_fused_lstm_cell" in text


def test_uninstall_removes_every_registration(router):
    x = torch.randn(1, 2, 4, 4)
    args = (torch.ones(2), torch.zeros(2), torch.zeros(2), torch.ones(2), True, 0.1, 1e-5)
    router.uninstall()
    try:
        assert router.registered == {} and not router.uses_fallback
        for name in ("aten::cudnn_batch_norm", "aten::convolution_overrideable"):
            assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
        assert not torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.CPU)
        with pytest.raises(NotImplementedError, match="Could not run 'aten::cudnn_batch_norm'"):
            aten.cudnn_batch_norm(x, *args)
    finally:
        router.install("auto")
    assert aten.cudnn_batch_norm(x, *args)[0].shape == x.shape
