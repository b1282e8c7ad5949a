"""The tables read from PyTorch's dispatcher and kept on disk (``aten.dispatcher.cached``) answer
what a fresh reading answers: a second process reads the file instead of rebuilding it, another
salt (the source of the rules that derive a table) makes another file, and a damaged or
unwritable cache is rebuilt in memory. The sim's default native set and its runtime primitives,
cached so, equal their fresh derivation."""
from __future__ import annotations

import os

import pytest
import torch

from flagos_torchfl.aten import dispatcher
from flagos_torchfl.sim.operators import native_ops


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "flagos_torchfl" / "aten"


def _builder(calls):
    def build(names):
        calls.append(len(names))
        return {"relu": [n for n in names if n.startswith("aten::relu")]}

    return build


def test_a_table_is_built_once_then_read_from_its_file(cache_home):
    calls = []
    first = dispatcher.cached("test", ("relu",), _builder(calls), salt=("rules v1",))
    again = dispatcher.cached("test", ("relu",), _builder(calls), salt=("rules v1",))
    assert first == again and "aten::relu" in first["relu"] and len(calls) == 1
    assert len(os.listdir(cache_home)) == 1
    dispatcher.cached("test", ("relu",), _builder(calls), salt=("rules v2",))
    assert len(calls) == 2 and len(os.listdir(cache_home)) == 2


def test_a_damaged_cache_file_is_rebuilt(cache_home):
    calls = []
    built = dispatcher.cached("test", ("relu",), _builder(calls))
    (path,) = cache_home.iterdir()
    path.write_text('{"relu": "not a list"')
    assert dispatcher.cached("test", ("relu",), _builder(calls)) == built and len(calls) == 2
    assert dispatcher.cached("test", ("relu",), _builder(calls)) == built and len(calls) == 2  # rewritten


def test_an_unwritable_cache_is_rebuilt_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where the folder would go
    calls = []
    first = dispatcher.cached("test", ("relu",), _builder(calls))
    assert dispatcher.cached("test", ("relu",), _builder(calls)) == first and len(calls) == 2


def test_the_cached_native_sets_equal_a_fresh_derivation(cache_home):
    cached = (native_ops.default_native_ops(), native_ops.runtime_primitive_names())
    for function in (native_ops._derived_sets, native_ops.default_native_ops, native_ops.runtime_primitive_names):
        function.cache_clear()
    try:
        fresh = (native_ops.default_native_ops(), native_ops.runtime_primitive_names())  # built: an empty cache
    finally:
        for function in (native_ops._derived_sets, native_ops.default_native_ops, native_ops.runtime_primitive_names):
            function.cache_clear()
    assert cached == fresh and any(n.startswith("native-") for n in os.listdir(cache_home))
    assert "aten::add.Tensor" in cached[0] and "aten::empty_strided" in cached[1]


def test_the_overloads_taking_a_generator_are_read_from_their_schemas(cache_home):
    dispatcher.with_generator.cache_clear()
    try:
        found = dispatcher.with_generator()
    finally:
        dispatcher.with_generator.cache_clear()
    expected = {n for n in dispatcher.all_aten()
                if any(str(a.type) == "Optional[Generator]" for a in torch._C._get_schema(*n.partition(".")[::2]).arguments)}
    assert found == expected and "aten::bernoulli_.float" in found
