"""Per-operator route overrides: FL_OP_ROUTE and routing config files (no backend needed)."""
from __future__ import annotations

import json

import pytest

import flagos_torchfl as ft
from flagos_torchfl.errors import ConfigError
from flagos_torchfl.routing import overrides
from flagos_torchfl.routing.config import routing_config


def test_spec_resolves_names_and_accepts_cpu():
    found = overrides.parse_spec("softmax=cpu, gelu=composite;aten::mm=library")
    assert found["aten::_softmax"] == ("fallback", "softmax=cpu", "FL_OP_ROUTE")
    assert found["aten::_softmax_backward_data"][0] == "fallback"
    assert found["aten::gelu"][0] == "composite" and found["aten::mm"][0] == "library"


@pytest.mark.parametrize("spec,message", [
    ("softmax=compsite", r"unknown route 'compsite'. Did you mean 'composite'\?.*Valid routes: native, library, composite, fallback, unsupported"),
    ("softmax", r"'softmax' is not NAME=ROUTE"),
    ("=cpu", r"'=cpu' is not NAME=ROUTE"),
    ("sofmax=cpu", r"FL_OP_ROUTE: unknown operator name 'sofmax'. Did you mean 'softmax'"),
])
def test_bad_specs_are_clear_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        overrides.parse_spec(spec)


def test_json_and_toml_files(tmp_path):
    j = tmp_path / "r.json"
    j.write_text(json.dumps({"routes": {"LayerNorm": "cpu"}}))
    assert overrides.load_file(j)["aten::native_layer_norm"][0] == "fallback"
    t = tmp_path / "r.toml"
    t.write_text('[routes]\nconv2d = "fallback"\n')
    assert overrides.load_file(t)["aten::convolution_overrideable"][0] == "fallback"


@pytest.mark.parametrize("content,suffix,message", [
    ("{", ".json", "is not valid JSON"),
    ('{"softmax": "cpu"}', ".json", "must hold a 'routes' table"),
    ('{"routes": {}, "extra": 1}', ".json", "unknown key 'extra'"),
    ("[routes\n", ".toml", "is not valid TOML"),
    ('{"routes": {"softmax": "fast"}}', ".json", "unknown route 'fast'"),
])
def test_bad_files_are_clear_errors(tmp_path, content, suffix, message):
    path = tmp_path / f"r{suffix}"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        overrides.load_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        overrides.load_file(tmp_path / "nope.json")


def test_environment_overrides_win_over_the_config_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"routes": {"softmax": "composite", "gelu": "cpu"}}))
    found = overrides.from_env({"FL_ROUTING_CONFIG": str(path), "FL_OP_ROUTE": "softmax=cpu"})
    assert found["aten::_softmax"][0] == "fallback" and found["aten::gelu"][0] == "fallback"


def test_load_routing_config_without_a_backend(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"routes": {"gelu": "cpu"}}))
    try:
        assert ft.load_routing_config(path) == {"aten::gelu": "fallback", "aten::gelu.out": "fallback",
                                                "aten::gelu_": "fallback"}
    finally:
        path.write_text('{"routes": {}}')
        assert ft.load_routing_config(path) == {}
    assert ft.routing_report() == []


def test_registration_mode_values():
    assert routing_config({}).registration == "auto"
    assert routing_config({"FL_ROUTING_REGISTRATION": "per-op"}).registration == "per-op"
    with pytest.raises(ConfigError, match="FL_ROUTING_REGISTRATION='perop' is not valid. Did you mean 'per-op'"):
        routing_config({"FL_ROUTING_REGISTRATION": "perop"})
