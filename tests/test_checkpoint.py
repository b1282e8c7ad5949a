"""Checkpoints across chips: ft.save's device record, ft.load, the committed fixtures tagged
``cuda:0`` and ``npu:0`` loaded with plain ``torch.load`` under activation, and weights_only kept."""
from __future__ import annotations

import io
import os
import pickle
import sys
import zipfile

import pytest
import torch

import flagos_torchfl as ft
from tests.helpers import ROOT, run_python

FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints"


def expected_state():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from make_checkpoint_fixtures import state
    finally:
        sys.path.pop(0)
    return state()


@pytest.mark.parametrize("to_file_object", [False, True])
def test_plain_torch_load_returns_exactly_what_ft_save_saved(tmp_path, to_file_object):
    obj = {"w": torch.randn(3, 2), "step": 4, "nested": [torch.arange(3), "x"]}
    obj["view"] = obj["w"].t()
    if to_file_object:
        target = io.BytesIO()
        ft.save(obj, target)
        target.seek(0)
    else:
        target = tmp_path / "ckpt.pt"
        ft.save(obj, target)
    loaded = torch.load(target)
    assert loaded.keys() == obj.keys() and loaded["step"] == 4 and loaded["nested"][1] == "x"
    assert torch.equal(loaded["w"], obj["w"]) and torch.equal(loaded["nested"][0], obj["nested"][0])
    assert loaded["view"].untyped_storage().data_ptr() == loaded["w"].untyped_storage().data_ptr()
    if to_file_object:
        target.seek(0)
    record = ft.checkpoint_info(target)
    assert record["devices"] == ["cpu"] and record["torch"] == torch.__version__
    assert record["backend"] is None and record["device_type"] == "cpu"


def test_a_plain_torch_save_has_no_record(tmp_path):
    torch.save({"a": torch.ones(1)}, tmp_path / "plain.pt")
    assert ft.checkpoint_info(tmp_path / "plain.pt") is None


def test_ft_load_without_activation_puts_another_chips_tensors_on_the_cpu():
    # what a plain process does (torch 2.1 fails in its HPU restore, which it tries for any tag)
    with pytest.raises((RuntimeError, AssertionError), match="tagged with npu:0|HPU device module is not loaded"):
        torch.load(FIXTURES / "npu0.pt")
    loaded = ft.load(FIXTURES / "npu0.pt")
    for key, value in expected_state().items():
        assert torch.equal(loaded[key], value) if isinstance(value, torch.Tensor) else loaded[key] == value
    assert ft.checkpoint_info(FIXTURES / "npu0.pt")["device_type"] == "npu"


class _RunsCode:
    def __reduce__(self):
        return (os.getcwd, ())


def test_a_pickle_carrying_code_is_still_refused_with_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    ft.save({"payload": _RunsCode()}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        ft.load(path, weights_only=True)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path, weights_only=True)
    assert zipfile.is_zipfile(path)


@pytest.mark.torch_feature("load_weights_only_default")
def test_a_pickle_carrying_code_is_still_refused_by_default(tmp_path):
    path = tmp_path / "evil.pt"
    ft.save({"payload": _RunsCode()}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        ft.load(path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path)


def _outcome(load, path):
    try:
        return "loaded", load(path)
    except pickle.UnpicklingError as error:
        return "refused", str(error).split(".")[0]


def test_ft_load_keeps_torchs_weights_only_default(tmp_path):
    """Refused where this torch's default refuses it, loaded (the code run) where it does not."""
    path = tmp_path / "evil.pt"
    ft.save({"payload": _RunsCode()}, path)
    got = _outcome(ft.load, path)
    assert got == _outcome(torch.load, path)
    assert got in (("refused", "Weights only load failed"), ("loaded", {"payload": os.getcwd()}))


LOAD_FIXTURES = """
import torch
for name in ("cuda0", "npu0"):
    state = torch.load("tests/fixtures/checkpoints/" + name + ".pt")
    shared = state["weight_t"].untyped_storage().data_ptr() == state["weight"].untyped_storage().data_ptr()
    print(name, state["weight"].device, state["bias"].device, state["epoch"], shared,
          state["weight"].cpu().tolist(), state["steps"].item())
"""


@pytest.mark.parametrize("backend, device", [("cpu", "cpu"),
                                             pytest.param("sim", "sim:0", marks=pytest.mark.needs_sim)])
def test_fixtures_tagged_cuda0_and_npu0_load_with_plain_torch_load(backend, device):
    proc = run_python(["-m", "flagos_torchfl", "run", "--", sys.executable, "-c", LOAD_FIXTURES],
                      env={"FL_BACKEND": backend, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    weight = expected_state()["weight"].tolist()
    lines = proc.stdout.splitlines()
    for name, line in zip(("cuda0", "npu0"), lines):
        assert line == f"{name} {device} {device} 3 True {weight} 7"
