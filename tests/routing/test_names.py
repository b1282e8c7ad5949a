"""The semantic name table: friendly, framework and vendor names and categories -> ATen."""
from __future__ import annotations

import pytest

from flagos_torchfl.errors import ConfigError
from flagos_torchfl.aten import dispatcher, names


def test_every_entry_of_the_data_file_exists_in_this_torch():
    # only an entry the file declares newer than the oldest supported torch may be absent
    newer = set(names.newer_than_floor())
    spelt = set()
    for category, entry in names.categories().items():
        for op in entry["ops"]:
            spelt.add(op)
            assert names.aten_overloads(op) or op in newer, f"{category}: {op}"
        for check in entry["check"]:
            for alternative in check.split("|"):
                spelt.add(alternative)
                assert names.aten_overloads(alternative) or alternative in newer, f"{category}: {alternative}"
    assert newer <= spelt, f"newer_than_floor names no entry of a category: {sorted(newer - spelt)}"
    for name, targets in names.table()["names"].items():
        for target in targets:
            assert target.startswith("aten::") or target in names.categories(), f"{name} -> {target}"


def test_an_entry_this_torch_lacks_is_left_out_and_said(monkeypatch, capfd):
    import copy
    import logging

    data = copy.deepcopy(names.table())
    data["categories"]["gelu"]["ops"].append("_gelu_from_a_later_torch")
    data["categories"]["gelu"]["check"] = ["_gelu_from_a_later_torch|gelu"]
    monkeypatch.setattr(names, "table", lambda: data)
    names.category_ops.cache_clear()
    logger = logging.getLogger("flagos_torchfl")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        assert names.absent_entries("gelu") == ("_gelu_from_a_later_torch",)
        ops = names.category_ops("gelu")
        assert "aten::gelu" in ops and not any("later_torch" in o for o in ops)
        assert "aten::gelu_backward" in names.resolve("GELU")
        # the check holds through the alternative this torch has
        assert names.category_is_native("gelu", dispatcher.native_set("CPU").__contains__)
    finally:
        logger.setLevel(level)
        names.category_ops.cache_clear()
    assert "category gelu: this torch has no _gelu_from_a_later_torch (left out)" in capfd.readouterr().err


def test_about_fifty_categories():
    assert 45 <= len(names.categories()) <= 60


@pytest.mark.parametrize("spelling", ["conv2d", "Conv2d", "Convolution", "Conv2D", "conv"])
def test_convolution_spellings(spelling):
    ops = names.resolve(spelling)
    assert {"aten::convolution_overrideable", "aten::convolution_backward_overrideable",
            "aten::convolution", "aten::convolution_backward"} <= ops


@pytest.mark.parametrize("spelling,expected", [
    ("LayerNorm", "aten::native_layer_norm_backward"), ("layer_norm", "aten::native_layer_norm"),
    ("layernorm", "aten::native_layer_norm"), ("softmax", "aten::_softmax_backward_data"),
    ("SDPA", "aten::_scaled_dot_product_efficient_attention"), ("MatMulV2", "aten::mm"),
    ("Linear", "aten::addmm"), ("GELU", "aten::gelu_backward"), ("CrossEntropyLoss", "aten::nll_loss_forward"),
    ("CrossEntropyLoss", "aten::_log_softmax"), ("Adam", "aten::_fused_adam_"),
])
def test_friendly_and_vendor_names(spelling, expected):
    assert expected in names.resolve(spelling)


def test_sdpa_means_every_attention_operator_this_torch_has():
    sdpa = names.resolve("SDPA")
    assert sdpa == names.category_ops("attention")
    # the CPU's own fused attention (newer than torch 2.1) where this torch has it
    for op in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"):
        assert set(names.aten_overloads(op)) <= sdpa
    cpu_flash = names.aten_overloads("_scaled_dot_product_flash_attention_for_cpu")
    assert cpu_flash or "_scaled_dot_product_flash_attention_for_cpu" in names.newer_than_floor()


def test_aten_spellings_win_over_lookalike_names():
    # "add" is the ATen operator (and its in-place form), "Add" the ONNX name of the category
    assert names.resolve("add") == {"aten::add.Tensor", "aten::add.Scalar", "aten::add.out",
                                    "aten::add.Scalar_out", "aten::add_.Tensor", "aten::add_.Scalar"}
    assert "aten::sub.Tensor" in names.resolve("Add")
    assert names.resolve("add.Tensor") == {"aten::add.Tensor"}
    assert names.resolve("aten::relu.default") == {"aten::relu"}
    # an ATen name that never reaches a backend (softmax decomposes first) is the semantic name
    assert "aten::_softmax" in names.resolve("softmax")
    # every overload this torch has (torch 2.1 lists softmax.Dimname too)
    assert names.resolve("aten::softmax") == set(dispatcher.overloads_by_packet()["softmax"])
    assert {"aten::softmax.int", "aten::softmax.int_out"} <= names.resolve("aten::softmax")
    assert "aten::_softmax" not in names.resolve("aten::softmax")
    assert names.resolve_semantic("tanh") == frozenset()


@pytest.mark.parametrize("bad,suggested", [("sofmax", "softmax"), ("LayerNrom", "LayerNorm"), ("gelu_bacward", "gelu_backward")])
def test_unknown_names_list_the_closest(bad, suggested):
    with pytest.raises(ConfigError, match=f"unknown operator name '{bad}'.*Did you mean.*'{suggested}'"):
        names.resolve(bad)


def test_other_namespaces_are_refused():
    with pytest.raises(ConfigError, match="only aten:: operators"):
        names.resolve("prims::add")


def test_categories_of_an_operator():
    assert "gelu" in names.categories_of("aten::gelu_backward")


def test_cpu_runs_every_category_natively():
    yes, no = names.category_coverage(dispatcher.native_set("CPU").__contains__)
    assert no == [] and len(yes) == len(names.categories())


def test_a_chip_without_convolution_kernels_lacks_the_category():
    native = dispatcher.native_set("CPU") - names.resolve("conv2d")
    yes, no = names.category_coverage(native.__contains__)
    assert "convolution" in no


def test_the_sim_resolves_semantic_names_through_the_hook():
    from flagos_torchfl import sim

    native = sim.parse_native_ops("LayerNorm,conv2d,add", resolve_name=names.resolve_semantic)
    assert {"aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::convolution",
            "aten::add.Tensor"} <= native
    assert "aten::sub.Tensor" not in native
