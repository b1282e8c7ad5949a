"""Native op sets and FL_SIM_* parsing (nothing is installed, so no isolation needed)."""
from __future__ import annotations

import json

import pytest
import torch

from flagos_torchfl.errors import ConfigError
from flagos_torchfl.backends.cpu import logical_device_count
from flagos_torchfl.backends.sim import SimBackend
from flagos_torchfl.sim import default_native_ops, parse_native_ops
from flagos_torchfl.sim.operators.native_ops import RUNTIME_PRIMITIVES, can_run_natively


def test_default_set_is_core_aten_plus_runtime_primitives():
    native = default_native_ops()
    for name in ("aten::add.Tensor", "aten::add.out", "aten::mm", "aten::convolution",
                 "aten::_local_scalar_dense", "aten::empty.memory_format", "aten::copy_",
                 "aten::_copy_from", "aten::_to_copy", "aten::set_.source_Storage",
                 "aten::resize_", "aten::as_strided", "aten::view", "aten::normal_",
                 "aten::masked_select"):
        assert name in native, name
    # every core overload that can get a kernel is in
    core = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")
            and torch.Tag.core in _overload(n).tags]
    assert {n for n in core if can_run_natively(n)} <= native
    # decompositions and backend-independent views are left to PyTorch
    for name in ("aten::var", "aten::where", "aten::detach", "aten::alias", "aten::expand"):
        assert name not in native, name
    assert "aten::cumprod" not in native  # not core: the routing layer's business


def _overload(name):
    packet, _, overload = name[len("aten::"):].partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def test_runtime_primitives_are_data():
    assert "copy_" in RUNTIME_PRIMITIVES and "empty.memory_format" in RUNTIME_PRIMITIVES


def test_parse_comma_list_all_name_forms():
    got = parse_native_ops("add, aten::mul.Tensor ,sub.Tensor,aten::relu,relu.default")
    assert {"aten::add.Tensor", "aten::add.Scalar", "aten::add.out"} <= got
    assert "aten::mul.Tensor" in got and "aten::mul.Scalar" not in got
    assert "aten::sub.Tensor" in got and "aten::sub.out" not in got
    assert "aten::relu" in got


def test_parse_text_file(tmp_path):
    path = tmp_path / "ops.txt"
    path.write_text("# compute ops\nadd.Tensor  # the common one\n\nmm.default, bmm\n")
    assert parse_native_ops(str(path)) == {"aten::add.Tensor", "aten::mm", "aten::bmm",
                                           "aten::bmm.out"}


def test_parse_json_list_and_object(tmp_path):
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(["mm.default", "aten::add.Tensor"]))
    assert parse_native_ops(str(listed)) == {"aten::mm", "aten::add.Tensor"}
    exported = tmp_path / "export.json"
    exported.write_text(json.dumps({"native_ops": ["bmm.default"], "backend": "sim"}))
    assert parse_native_ops(str(exported)) == {"aten::bmm"}


def test_parse_bad_json_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ops": ["mm"]}))
    with pytest.raises(ConfigError, match="native_ops"):
        parse_native_ops(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        parse_native_ops(str(tmp_path / "missing.json"))


def test_unknown_name_suggests_closest():
    with pytest.raises(ConfigError, match="Did you mean 'addmm'"):
        parse_native_ops("adddmm")
    with pytest.raises(ConfigError, match="'add.Tensor'"):
        parse_native_ops("add.Tensr")


def test_resolve_name_hook_expands_names():
    table = {"pointwise": ["add.Tensor", "mul.Tensor"]}
    got = parse_native_ops("pointwise,mm", resolve_name=lambda n: table.get(n, ()))
    assert got == {"aten::add.Tensor", "aten::mul.Tensor", "aten::mm", "aten::mm.out"}


def test_sim_settings_from_the_environment():
    def count(environ):
        return logical_device_count("FL_SIM_DEVICES", environ)

    def native(environ):
        return SimBackend().options(environ)["native_ops"]

    assert count({}) == 1 and native({}) is None
    assert count({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert count({"LOCAL_WORLD_SIZE": "4", "FL_SIM_DEVICES": "2"}) == 2
    assert native({"FL_SIM_NATIVE_OPS": "mm"}) == {"aten::mm", "aten::mm.out"}  # a bare name: all its overloads
    assert native({"FL_SIM_NATIVE_OPS": "  "}) is None
    for bad in ("two", "0", "-1", "1.5"):
        with pytest.raises(ConfigError, match="FL_SIM_DEVICES"):
            count({"FL_SIM_DEVICES": bad})
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE"):
        count({"LOCAL_WORLD_SIZE": "x"})
