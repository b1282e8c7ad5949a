"""The vendors' operator tables (data/chips/*.json), their loader and the tool that writes them.

The fixtures in tests/fixtures/chip_tables are tiny sources in each vendor's format (a wheel with
torch_npu's table, torch_mlu's and torch_musa's yaml) and the files the tool wrote from them."""
from __future__ import annotations

import importlib.util
import json
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from flagos_torchfl.tables import op_tables
from flagos_torchfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "chip_tables"
DATA = ROOT / "src" / "flagos_torchfl" / "data" / "chips"
CHIPS = ["ascend", "cambricon", "mthreads"]

_spec = importlib.util.spec_from_file_location("chip_tables", ROOT / "tools" / "chip_tables.py")
chip_tables = sys.modules.setdefault("chip_tables", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(chip_tables)

TORCH = torch.__version__.split("+", 1)[0]
KNOWN = frozenset(torch._C._dispatch_get_all_op_names())


def raw(chip: str) -> dict:
    return json.loads((DATA / f"{chip}.json").read_text("utf-8"))


def test_every_chip_has_a_table_that_loads():
    assert op_tables.available() == CHIPS
    for chip, device in zip(CHIPS, ["npu", "mlu", "musa"]):
        table = op_tables.load(chip)
        assert (table.chip, table.device_type) == (chip, device)
        assert len(table.ops) > 700 and all(op.startswith("aten::") for op in table.ops)
        assert table.source["date"] and table.source["sha256"] and table.source["path"]
        assert table.dense_ops == table.ops - set(table.only_for)


@pytest.mark.parametrize("chip", CHIPS)
def test_counts_equal_the_lists_and_the_file_is_canonical(chip):
    data = raw(chip)
    counts = data["counts"]
    for key in ("ops", "unknown_to_torch", "only_for", "vendor_ops"):
        assert counts[key] == len(data[key]), key
    for key in ("ops", "unknown_to_torch", "vendor_ops"):
        assert data[key] == sorted(set(data[key])), f"{key} not sorted and unique"
    assert not set(data["ops"]) & set(data["unknown_to_torch"])
    assert set(data["only_for"]) <= set(data["ops"]) | set(data["unknown_to_torch"])
    aten = counts["ops"] + counts["unknown_to_torch"] + counts["vendor_ops"]
    assert counts["entries"] == aten + counts["duplicates"]
    assert (DATA / f"{chip}.json").read_text("utf-8") == chip_tables.render(data)


@pytest.mark.parametrize("chip", CHIPS)
def test_the_split_matches_this_torch(chip):
    data = raw(chip)
    if data["torch_checked"] != TORCH:
        pytest.skip(f"table checked against torch {data['torch_checked']}, this is {TORCH}")
    assert set(data["ops"]) <= KNOWN
    assert not set(data["unknown_to_torch"]) & KNOWN


def test_ascend_facts():
    table = op_tables.load("ascend")
    assert table.source["package"] == "torch-npu" and table.source["version"] == "2.14.0"
    assert "aten::scaled_dot_product_attention" in table.dense_ops
    assert "aten::_thnn_fused_lstm_cell" in table.dense_ops
    assert "aten::_scaled_dot_product_flash_attention" not in table.ops
    assert "aten::_scaled_dot_product_flash_attention" not in table.unknown
    assert table.only_for["aten::int_repr"] == ("quantized",)
    assert table.only_for["aten::_coalesce"] == ("sparse",)
    assert "npu::npu_format_cast" in table.vendor_ops
    assert not any(op.startswith("aten::npu_") for op in table.ops | set(table.unknown))


def test_unknown_chip_names_the_valid_ones_and_the_closest():
    with pytest.raises(ConfigError) as err:
        op_tables.load("ascnd")
    message = str(err.value)
    assert "'ascnd'" in message and "Did you mean 'ascend'?" in message
    assert "ascend, cambricon, mthreads" in message


ASCEND_YAML = """
backend: NPU
cpp_namespace: at_npu::native
supported:
  - relu
  - add.Tensor
  - aten::sub.Tensor
  - abs.default
  - func: mm
    impl_ns: op_api
  - func: mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)
  - made_up_op.Tensor
  - npu_thing
  - func: _coalesce(Tensor self) -> Tensor
    sparse: op_api
  - func: max(Tensor self) -> Tensor
    impl_ns: op_api
    sparse: op_api
symint:
  - func: embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1) -> Tensor
  - relu
quant:
  - func: int_repr(Tensor self) -> Tensor
custom:
  - func: npu_thing(Tensor self) -> Tensor
"""


def test_ascend_parser_reads_every_entry_form_and_keeps_unknown_names():
    parsed = chip_tables.parse_ascend(ASCEND_YAML)
    table = chip_tables.build_table("ascend", {"kind": "test"}, parsed, TORCH, KNOWN)
    assert table["ops"] == ["aten::_coalesce", "aten::abs", "aten::add.Tensor", "aten::embedding",
                            "aten::int_repr", "aten::max", "aten::mm", "aten::mul.out", "aten::relu",
                            "aten::sub.Tensor"]
    assert table["unknown_to_torch"] == ["aten::made_up_op.Tensor"]
    assert table["only_for"] == {"aten::_coalesce": ["sparse"], "aten::int_repr": ["quantized"]}
    assert parsed.aten["aten::max"] == {"dense", "sparse"}
    assert table["vendor_ops"] == ["npu::npu_thing"]
    assert table["counts"] == {"entries": 14, "duplicates": 2, "ops": 10, "unknown_to_torch": 1,
                               "only_for": 2, "vendor_ops": 1}


def test_cambricon_parser_reads_sections_namespaces_and_dispatch():
    parsed = chip_tables.parse_cambricon((FIXTURES / "mlu_functions.yaml").read_text("utf-8"))
    table = chip_tables.build_table("cambricon", {"kind": "test"}, parsed, TORCH, KNOWN)
    assert table["ops"] == ["aten::_coalesce", "aten::add.Tensor", "aten::cat", "aten::cat.out",
                            "aten::mul.Tensor", "aten::relu"]
    assert table["unknown_to_torch"] == ["aten::bernoulli_.p"]
    assert table["only_for"] == {"aten::_coalesce": ["sparse"]}
    assert table["vendor_ops"] == ["torch_mlu::fused_sgd", "torchaudio::rnnt_loss", "torchvision::nms"]


def test_mthreads_parser_reads_joined_dispatch_keys():
    parsed = chip_tables.parse_mthreads((FIXTURES / "musa_functions.yaml").read_text("utf-8"))
    assert parsed.aten["aten::quantize_per_tensor"] == {"dense", "quantized"}
    assert parsed.aten["aten::int_repr"] == {"quantized"}
    assert parsed.aten["aten::_nested_tensor_size"] == {"nested"}
    table = chip_tables.build_table("mthreads", {"kind": "test"}, parsed, TORCH, KNOWN)
    assert table["unknown_to_torch"] == ["aten::_fused_rmsnorm_forward", "aten::mean.names_dim"]
    assert table["counts"]["unknown_to_torch"] == 2


@pytest.mark.parametrize("parse, text, problem", [
    ("parse_ascend", "supported:\n  - func: 3\n", "mapping with a 'func' string"),
    ("parse_ascend", "supported:\n  - 'add Tensor(Tensor self)'\n", "not an operator name"),
    ("parse_ascend", "supported:\n  - prims::add\n", "namespace 'prims', expected 'aten'"),
    ("parse_ascend", "suported: []\n", "unknown sections ['suported']"),
    ("parse_cambricon", "aten:\n  - func: relu\n    dispatch: CUDA\n", "unknown dispatch key 'CUDA'"),
    ("parse_mthreads", "aten: []\n", "expected a yaml list"),
])
def test_parsers_reject_forms_they_do_not_know(parse, text, problem):
    with pytest.raises(ValueError) as err:
        getattr(chip_tables, parse)(text)
    assert problem in str(err.value)


def _regenerate(chip: str, tmp_path: Path) -> str:
    out = tmp_path / f"{chip}.json"
    expected = json.loads((FIXTURES / f"expected_{chip}.json").read_text("utf-8"))
    source = expected["source"]
    if chip == "ascend":
        args = [str(FIXTURES / source["file"]), "--version", source["version"]]
    else:
        args = [str(FIXTURES / Path(source["path"]).name), "--repository", source["repository"],
                "--ref", source["ref"], "--commit", source["commit"], "--path", source["path"],
                "--date", source["date"]]
    assert chip_tables.main([chip, *args, "--out", str(out)]) == 0
    return out.read_text("utf-8")


@pytest.mark.parametrize("chip", CHIPS)
def test_regenerating_from_the_fixture_source_is_byte_identical(chip, tmp_path):
    expected = (FIXTURES / f"expected_{chip}.json").read_text("utf-8")
    checked = json.loads(expected)["torch_checked"]
    expected = expected.replace(f'"torch_checked": "{checked}"', f'"torch_checked": "{TORCH}"')
    first = _regenerate(chip, tmp_path)
    assert first == expected
    assert _regenerate(chip, tmp_path) == first


def test_wheel_must_be_the_named_package_version(tmp_path, capsys):
    wheel = FIXTURES / "torch_npu-0.0.1-py3-none-any.whl"
    code = chip_tables.main(["ascend", str(wheel), "--version", "2.14.0", "--out", str(tmp_path / "a.json")])
    assert code == 2 and "is torch_npu 0.0.1, not torch-npu 2.14.0" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()


def test_wheel_without_the_table_lists_its_yaml_files(tmp_path, capsys):
    wheel = tmp_path / "torch_npu-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(FIXTURES / wheel.name) as src, zipfile.ZipFile(wheel, "w") as dst:
        for info in src.infolist():
            name = info.filename.replace("_by_codegen", "")
            dst.writestr(name, src.read(info))
    assert chip_tables.main(["ascend", str(wheel), "--version", "0.0.1", "--out", str(tmp_path / "a.json")]) == 2
    assert "its yaml files: torch_npu/csrc/aten/npu_native_functions.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("option, value, problem", [
    ("--date", "18.02.2025", "must be YYYY-MM-DD"),
    ("--commit", "9e95f97", "full 40-digit"),
])
def test_repository_provenance_is_checked(option, value, problem, tmp_path, capsys):
    args = {"--repository": "Example/torch_mlu", "--ref": "main", "--path": "codegen/mlu_functions.yaml",
            "--commit": "0123456789abcdef0123456789abcdef01234567", "--date": "2024-01-02", option: value}
    argv = ["cambricon", str(FIXTURES / "mlu_functions.yaml"), "--out", str(tmp_path / "c.json")]
    argv += [part for pair in args.items() for part in pair]
    assert chip_tables.main(argv) == 2
    assert problem in capsys.readouterr().err
