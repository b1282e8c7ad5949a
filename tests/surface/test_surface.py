"""The CUDA surface generated from the installed torch, and its classification table: every entry
of this torch has a verdict on every backend kind, a new entry point is reported, and the
table's verdicts for ``torch.cuda`` hold under activation."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl import compat
from flagos_torchfl.errors import UnsupportedFeatureError
from flagos_torchfl.redirect import REGISTRY
from flagos_torchfl.surface import entries, table
from flagos_torchfl.surface.entries import Entry


@pytest.fixture(scope="module")
def surface():
    """The surface of the installed torch, read before any activation."""
    return entries.generate()


def _names(found):
    return {e.name for e in found}


def test_the_generator_finds_known_entries(surface):
    by_name = {e.name: e for e in surface}
    expected = {"torch.cuda.set_device", "aten::arange.start_step", "torch.Tensor.to", "torch.Tensor.cuda",
                "torch.UntypedStorage.cuda", "torch.nn.Module.to", "torch.zeros", "torch.load",
                "torch.cuda.CUDAGraph", "torch.backends.cuda.is_built", "torch.distributed.init_process_group",
                "torch.library.impl", "torch.autograd.profiler.emit_nvtx"}
    if compat.has("stream_event"):
        expected.add("torch.Stream")
    assert expected <= set(by_name), sorted(expected - set(by_name))
    assert by_name["aten::arange.start_step"].kind == "operator"
    assert "device_constructor" in by_name["torch.zeros"].tags
    assert "device" in by_name["torch.Tensor.to"].reasons  # read from its docstring's overloads
    assert by_name["torch.cuda.CUDAGraph"].kind == "class"
    assert len(surface) == len(_names(surface))


def test_parameters_are_read_from_cpp_docstrings_and_python_signatures():
    assert "device" in [name for name, _ in entries.parameters(torch.zeros)]  # a C++ binding
    assert "device" in [name for name, _ in entries.parameters(torch.Tensor.cuda)]
    assert "non_blocking" in [name for name, _ in entries.parameters(torch.UntypedStorage.cuda)]  # Python
    assert entries.parameters(lambda: None) == []


@pytest.mark.parametrize("kind", table.KINDS)
def test_every_entry_of_this_torch_is_classified(surface, kind):
    rows = table.load().classify(surface, kind)
    missing = table.unclassified(rows)
    assert not missing, (f"torch {torch.__version__}: {len(missing)} entries unclassified on {kind} "
                         f"(data/cuda_surface.json): " + ", ".join(r.entry.name for r in missing))
    assert {r.verdict.verdict for r in rows} <= set(table.VERDICTS)


def test_the_table_names_only_registered_patches():
    registered = {p.name for p in REGISTRY}
    assert set(table.load().patches()) <= registered, sorted(set(table.load().patches()) - registered)


def test_a_new_entry_point_is_reported_unclassified(monkeypatch):
    def peer_bandwidth(device=None, peer_device=None):
        return 0

    def fresh_factory(size, *, device=None):
        return torch.zeros(size, device=device)

    def is_fresh_feature_supported():
        return False

    peer_bandwidth.__module__ = is_fresh_feature_supported.__module__ = "torch.cuda"  # as torch's own
    fresh_factory.__module__ = "torch"
    monkeypatch.setattr(torch.cuda, "peer_bandwidth", peer_bandwidth, raising=False)
    monkeypatch.setattr(torch, "fresh_factory", fresh_factory, raising=False)
    monkeypatch.setattr(torch.cuda, "is_fresh_feature_supported", is_fresh_feature_supported, raising=False)
    rows = {r.entry.name: r for r in table.load().classify(entries.generate(), "cpu")}
    missing = {r.entry.name for r in table.unclassified(rows.values())}
    assert missing == {"torch.cuda.peer_bandwidth", "torch.fresh_factory"}
    # a torch.cuda name that takes no device is the facade's by its rule: a stand-in on the cpu backend
    assert rows["torch.cuda.is_fresh_feature_supported"].verdict.verdict == "refused"


def test_an_explicit_entry_wins_over_a_rule_and_two_rules_leave_an_entry_unclassified():
    data = {"rules": [{"id": "ops", "match": {"kind": "operator"}, "verdict": "passed"},
                      {"id": "aten", "match": {"namespace": "aten"}, "verdict": "passed"},
                      {"id": "cuda", "match": {"glob": "torch.cuda.*"}, "verdict": "refused", "reason": "r"}],
            "entries": [{"id": "one", "names": ["torch.cuda.x"], "verdict": "answered", "with": "w",
                         "per_kind": {"cpu": {"verdict": "passed"}}}]}
    made = table.Table(data)
    op = Entry("aten::zeros", "operator", "aten", frozenset({"device"}))
    x = Entry("torch.cuda.x", "function", "torch.cuda", frozenset({"whole"}))
    y = Entry("torch.cuda.y", "function", "torch.cuda", frozenset({"whole"}))
    rows = {r.entry.name: r for r in made.classify([op, x, y], "sim")}
    assert rows["aten::zeros"].verdict is None and "ops, aten" in rows["aten::zeros"].problem
    assert (rows["torch.cuda.x"].verdict.verdict, rows["torch.cuda.x"].verdict.detail) == ("answered", "w")
    assert rows["torch.cuda.y"].verdict.source == "cuda"
    assert made.classify([x], "cpu")[0].verdict.verdict == "passed"


@pytest.mark.parametrize("bad, says", [
    ({"rules": [{"id": "r", "match": {"kind": "operator"}, "verdict": "maybe"}], "entries": []}, "unknown verdict 'maybe'"),
    ({"rules": [{"id": "r", "match": {"colour": "x"}, "verdict": "passed"}], "entries": []}, "unknown match keys"),
    ({"rules": [], "entries": [{"id": "a", "names": ["n"], "verdict": "passed"},
                               {"id": "b", "names": ["n"], "verdict": "passed"}]}, "listed in both"),
    ({"rules": [], "entries": [{"id": "a", "names": ["n"], "verdict": "passed",
                                "per_kind": {"tpu": {"verdict": "passed"}}}]}, "unknown backend kind 'tpu'"),
])
def test_a_malformed_table_is_refused_naming_the_problem(bad, says):
    with pytest.raises(table.TableError, match=says):
        table.Table(bad)


def test_an_unknown_backend_kind_is_refused():
    with pytest.raises(table.TableError, match="valid: cpu, sim"):
        table.load().classify([], "tpu")


def test_a_profile_refusal_names_the_chips_counterpart(surface):
    rows = {r.entry.name: r.verdict for r in table.load().classify(surface, "ascend")}
    assert rows["torch.cuda.CUDAPluggableAllocator"].verdict == "refused"
    assert rows["torch.cuda.CUDAPluggableAllocator"].counterpart == "torch.npu.NPUPluggableAllocator"
    assert rows["torch.cuda.CUDAGraph"].verdict == "answered"
    assert rows["torch.cuda.caching_allocator_alloc"].verdict == "answered"


@pytest.fixture
def cpu_backend(monkeypatch):
    for var in ("FL_BACKEND", "FL_GPU_IDS", "FL_CPU_DEVICES", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    ft.deactivate()
    yield ft.init_backend("cpu")
    ft.deactivate()


def test_the_torch_cuda_verdicts_hold_under_activation(surface, cpu_backend):
    from flagos_torchfl.redirect.cuda_api import active_facade

    facade = active_facade()
    rows = [r for r in table.load().classify(surface, "cpu") if r.entry.namespace == "torch.cuda"]
    for row in rows:
        name = row.entry.name.rpartition(".")[2]
        if row.verdict.source in ("torch.cuda", "cuda-storages", "cuda-device-module-with-device"):
            assert row.verdict.verdict == "refused", row.entry.name  # the host runtime has none of them
            with pytest.raises(UnsupportedFeatureError, match=name):
                getattr(getattr(torch.cuda, name), "any_attribute")
    ft.deactivate()
    served = set(facade.served())  # read with torch.cuda itself back (it lists torch.cuda.memory's names)
    for row in rows:
        if row.entry.name.rpartition(".")[2] in served:
            assert row.verdict.verdict in ("answered", "redirected"), row.entry.name
