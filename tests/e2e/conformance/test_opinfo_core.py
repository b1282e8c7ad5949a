"""CI conformance on the sim with the core native set: the OpInfos of ``ci_subset.txt``
against the CPU (the whole database: ``python tools/opinfo_sweep.py --native core``)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.isolated


def test_ci_subset_matches_the_cpu():
    from tests.e2e.conformance import harness

    count, summary = harness.run_ci_subset("core")
    assert count >= 100
    failing = {f["op"] for f in summary["failures"]}
    assert failing <= set(harness.KNOWN_FAILURES), summary["failures"][:5]
    assert summary["pass_rate"] >= 0.99, summary["pass_rate"]
    routes = summary["routes"]
    for route in ("native", "composite", "fallback"):
        assert routes[route]["through"] > 0, route
