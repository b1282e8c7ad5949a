"""Conformance of routed operators against PyTorch's own OpInfo database.

Every OpInfo sample that supports float32 runs on the CPU and on ``sim``; forward outputs are
compared with ``torch.testing.assert_close`` (float32 defaults), and for OpInfos that support
autograd the gradients of every input too. Each sample is classified by the most costly route
any of its operators took (native < library < composite < fallback), read from the router's
statistics before and after the sample.

Used by ``tests/e2e/conformance/test_opinfo_*.py`` (a CI subset) and ``tools/opinfo_sweep.py``
(the whole database, in crash-proof subprocess chunks).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch.utils._pytree import tree_flatten

HERE = Path(__file__).resolve().parent
ROUTES = ("native", "library", "composite", "fallback", "unsupported")

#: OpInfos not run, with the reason (at most 5% of the float32 OpInfos).
SKIP: Dict[str, str] = {
    **{name: "random output: the sim's generator and the CPU's draw different numbers" for name in (
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
        "normal.in_place", "normal.number_mean", "uniform", "rand_like", "randn", "randn_like",
        "randint", "randint_like", "nn.functional.dropout", "nn.functional.dropout2d",
        "nn.functional.dropout3d", "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train", "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    )},
}

#: OpInfos whose output is uninitialised memory: only shape, dtype and strides are compared.
METADATA_ONLY = frozenset({"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                           "new_empty_strided"})


def opinfo_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def float32_opinfos() -> list:
    """Every OpInfo whose CPU dtypes include float32."""
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


#: OpInfos with samples that fail for a reason that is not a routing defect.
KNOWN_FAILURES: Dict[str, str] = {
    "nn.functional.scaled_dot_product_attention": (
        "samples without dropout that the CPU computes with its fused flash kernel: the sim "
        "(Core set) runs the math attention, and PyTorch's own math and flash kernels differ by "
        "up to ~8e-5 in float32 gradients, above assert_close's 1e-5"),
    **{name: ("samples that normalise a single element: x - mean is rounding noise scaled by "
              "1/sqrt(eps) = 316; without a native_layer_norm kernel (small set) PyTorch's own "
              "composite (batch-norm based, what every backend lacking one runs) rounds "
              "differently from the CPU kernel") for name in ("nn.functional.layer_norm", "native_layer_norm")},
    "linalg.householder_product": (
        "small set only: the blocked-matmul test library sums in another order (by design), and "
        "the backward's long chain of products amplifies the float32 difference to ~1e-4 relative"),
    "native_batch_norm": (
        "in eval mode PyTorch returns the running statistics as save_mean/save_invstd on non-CPU "
        "devices (CUDA, meta, its decomposition) and empty tensors on the CPU; unused in eval mode"),
}


def _names(filename: str) -> List[str]:
    lines = (HERE / filename).read_text().splitlines()
    return [n.strip() for line in lines for n in line.split("#", 1)[0].split(",") if n.strip()]


def small_native_ops() -> List[str]:
    """The ~40 operators of the small native set (``native_small.txt``)."""
    return _names("native_small.txt")


def ci_subset() -> List[str]:
    """The OpInfos CI runs (``ci_subset.txt``)."""
    return _names("ci_subset.txt")


def run_ci_subset(native: str) -> Tuple[int, dict]:
    """Start the sim with the ``native`` set ("core" or "small"), run the CI subset's samples
    against the CPU; returns (number of OpInfos run, :func:`summarise` of the outcomes)."""
    router = start_sim(native)
    by_name = {opinfo_id(op): op for op in float32_opinfos()}
    names = ci_subset()
    outcomes = [o for name in names for o in run_opinfo(by_name[name], router)]
    return len(names), summarise(outcomes)


@dataclasses.dataclass
class Outcome:
    """One sample: ``route`` is the most costly route any of its operators took, ``routes``
    every routed route it went through."""

    op: str
    sample: int
    route: str
    ok: bool
    stage: str = ""
    error: str = ""
    routes: List[str] = dataclasses.field(default_factory=list)


def _route_counts(router) -> Dict[str, int]:
    totals = dict.fromkeys(ROUTES, 0)
    for row in router.stats.rows():
        for route, counts in row["routes"].items():
            totals[route] += counts["calls"]
    return totals


def _classify(before: Dict[str, int], after: Dict[str, int], failed_unsupported: bool):
    """(most costly route, every routed route taken)."""
    taken = [r for r in ("library", "composite", "fallback") if after[r] > before[r]]
    if failed_unsupported:
        return "unsupported", taken + ["unsupported"]
    return (taken[-1] if taken else "native"), taken


def _move(value, device):
    """The tensor on ``device`` with its whole storage and the same size, stride and offset
    (views into a larger storage stay such views); a leaf again if it required grad."""
    if not isinstance(value, torch.Tensor):
        return value
    with torch.no_grad():
        numel = value.untyped_storage().nbytes() // value.element_size()
        whole = value.detach().as_strided((numel,), (1,), 0).to(device)
        moved = whole.as_strided(value.shape, value.stride(), value.storage_offset())
    return moved.requires_grad_(value.requires_grad)


def _leaves(sample) -> list:
    flat, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad]


def _compare(actual, expected, metadata_only: bool) -> None:
    a_flat, _ = tree_flatten(actual)
    e_flat, _ = tree_flatten(expected)
    if len(a_flat) != len(e_flat):
        raise AssertionError(f"{len(a_flat)} outputs, expected {len(e_flat)}")
    for a, e in zip(a_flat, e_flat):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"got {type(a).__name__}, expected a tensor")
            a = a.detach().cpu()
            if metadata_only:
                assert (a.shape, a.dtype) == (e.shape, e.dtype), f"{a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
                continue
            torch.testing.assert_close(a, e.detach(), equal_nan=True, check_device=False)
        elif isinstance(e, float) and isinstance(a, float) and e != e:
            assert a != a
        else:
            assert a == e, f"{a!r} != {e!r}"


def _differentiable(outputs) -> list:
    flat, _ = tree_flatten(outputs)
    return [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None]


def _grads(outputs, leaves, seed: int) -> Optional[list]:
    outs = _differentiable(outputs)
    if not outs or not leaves:
        return None
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs]
    return list(torch.autograd.grad(outs, leaves, weights, allow_unused=True))


def _samples(op, device: str, grad: bool) -> list:
    """The OpInfo's samples made on ``device``, as PyTorch's device tests make them (tensors
    that must stay on the CPU, such as some index arguments, do)."""
    torch.manual_seed(0)
    return list(op.sample_inputs(device, torch.float32, requires_grad=grad))


def _host_twin(sample, device: str):
    """The sample with its device tensors copied to the CPU now (samples may share tensors
    that an earlier sample changed in place, such as batch norm's running statistics)."""
    return sample.transform(lambda t: _move(t, "cpu") if isinstance(t, torch.Tensor) and t.device.type == device else t)


def run_opinfo(op, router, device: str = "sim", backward: bool = True) -> List[Outcome]:
    """Run every float32 sample of OpInfo ``op`` on ``device`` and on the CPU and compare."""
    name = opinfo_id(op)
    grad = backward and op.supports_autograd
    outcomes: List[Outcome] = []
    try:
        samples = _samples(op, device, grad)
    except Exception as exc:
        route = "unsupported" if type(exc).__name__ == "OperatorNotSupportedError" else "native"
        return [Outcome(name, -1, route, False, "samples", f"{type(exc).__name__}: {str(exc)[:400]}")]
    for index, dev_sample in enumerate(samples):
        try:
            sample = _host_twin(dev_sample, device)
            expected = op(sample.input, *sample.args, **sample.kwargs)
            processed = sample.output_process_fn_grad(expected)
            expected_grads = _grads(processed, _leaves(sample), index) if grad else None
        except Exception:
            continue  # the CPU rejects this sample too
        before = _route_counts(router)
        stage, ok, error, unsupported = "forward", True, "", False
        try:
            actual = op(dev_sample.input, *dev_sample.args, **dev_sample.kwargs)
            _compare(actual, expected, name in METADATA_ONLY)
            if expected_grads is not None:
                stage = "backward"
                actual_grads = _grads(dev_sample.output_process_fn_grad(actual), _leaves(dev_sample), index)
                _compare(actual_grads, expected_grads, False)
        except Exception as exc:
            from flagos_torchfl.errors import OperatorNotSupportedError

            ok = False
            unsupported = isinstance(exc, OperatorNotSupportedError)
            error = f"{type(exc).__name__}: {str(exc).strip()[:400]}"
        route, taken = _classify(before, _route_counts(router), unsupported)
        outcomes.append(Outcome(name, index, route, ok, "" if ok else stage, error, taken))
    return outcomes


def start_sim(native: str):
    """Install the sim with the ``native`` set and route it; returns the router. ``core``: Core
    ATen; ``small``: :func:`small_native_ops` plus the blocked-matmul test kernel library. Call
    once per process."""
    if native == "small":
        from flagos_torchfl.routing.providers import register_provider
        from tests.routing.blocked_provider import BlockedMatmul

        os.environ["FL_SIM_NATIVE_OPS"] = ",".join(small_native_ops())
        register_provider(BlockedMatmul)
    elif native != "core":
        raise ValueError(f"native set {native!r}: use 'core' or 'small'")
    from flagos_torchfl import routing
    from flagos_torchfl.machine import activation
    from flagos_torchfl.selection import build_selection

    selection = build_selection("sim", {})
    activation.activate(selection.chip, selection)
    routing.activate(selection)
    return routing.active_router()


def summarise(outcomes: Iterable[Outcome]) -> dict:
    """Share of samples per route and pass rate per route, plus the failures."""
    outcomes = list(outcomes)
    total = len(outcomes)
    per_route = {}
    for route in ROUTES:
        rows = [o for o in outcomes if o.route == route]
        through = [o for o in outcomes if route in o.routes or (route == "native" and not o.routes)]
        passed = sum(o.ok for o in rows)
        per_route[route] = {"samples": len(rows), "share": len(rows) / total if total else 0.0,
                            "passed": passed, "pass_rate": passed / len(rows) if rows else None,
                            "through": len(through), "through_share": len(through) / total if total else 0.0,
                            "through_pass_rate": sum(o.ok for o in through) / len(through) if through else None}
    passed = sum(o.ok for o in outcomes)
    return {"samples": total, "passed": passed, "pass_rate": passed / total if total else None,
            "routes": per_route, "failures": [dataclasses.asdict(o) for o in outcomes if not o.ok]}


def worker_main(native: str, names: List[str], out_path: str) -> int:
    """Run the named OpInfos and write their outcomes as JSON lines (one line per OpInfo, so a
    crash loses only the OpInfo it happened in)."""
    router = start_sim(native)
    by_name = {opinfo_id(op): op for op in float32_opinfos()}
    with open(out_path, "a", encoding="utf-8") as fh:
        for name in names:
            try:
                outcomes = run_opinfo(by_name[name], router)
            except Exception:
                outcomes = [Outcome(name, -1, "native", False, "harness", traceback.format_exc()[-800:])]
            fh.write(json.dumps({"op": name, "outcomes": [dataclasses.asdict(o) for o in outcomes]}) + "\n")
            fh.flush()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1], sys.argv[3].split(","), sys.argv[2]))
