"""The semantic name table: friendly, framework and vendor names and categories -> ATen."""
from __future__ import annotations

import pytest

from flagos_torchfl.errors import ConfigError
from flagos_torchfl.aten import dispatcher, names


def test_every_entry_of_the_data_file_exists_in_this_torch():
    for category, entry in names.categories().items():
        for op in entry["ops"]:
            assert names.aten_overloads(op), f"{category}: {op}"
        for check in entry["check"]:
            for alternative in check.split("|"):
                assert names.aten_overloads(alternative), f"{category}: {alternative}"
    for name, targets in names.table()["names"].items():
        for target in targets:
            assert target.startswith("aten::") or target in names.categories(), f"{name} -> {target}"


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
    ("SDPA", "aten::_scaled_dot_product_flash_attention_for_cpu"), ("MatMulV2", "aten::mm"),
    ("Linear", "aten::addmm"), ("GELU", "aten::gelu_backward"), ("CrossEntropyLoss", "aten::nll_loss_forward"),
    ("CrossEntropyLoss", "aten::_log_softmax"), ("Adam", "aten::_fused_adam_"),
])
def test_friendly_and_vendor_names(spelling, expected):
    assert expected in names.resolve(spelling)


def test_aten_spellings_win_over_lookalike_names():
    # "add" is the ATen operator (and its in-place form), "Add" the ONNX name of the category
    assert names.resolve("add") == {"aten::add.Tensor", "aten::add.Scalar", "aten::add.out",
                                    "aten::add.Scalar_out", "aten::add_.Tensor", "aten::add_.Scalar"}
    assert "aten::sub.Tensor" in names.resolve("Add")
    assert names.resolve("add.Tensor") == {"aten::add.Tensor"}
    assert names.resolve("aten::relu.default") == {"aten::relu"}
    # an ATen name that never reaches a backend (softmax decomposes first) is the semantic name
    assert "aten::_softmax" in names.resolve("softmax")
    assert names.resolve("aten::softmax") == {"aten::softmax.int", "aten::softmax.int_out"}
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
