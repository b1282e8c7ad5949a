"""Importing is free: no device initialised, no vendor plugin imported, nothing patched."""
import warnings

import pytest

from flagos_torchfl import compat
from tests.helpers import run_python

CHECK = r'''
import sys, torch
before = {name: getattr(torch, name) for name in ("zeros", "device", "load")}
cuda_available = torch.cuda.is_available
tensor_to = torch.Tensor.to
import flagos_torchfl as ft
assert torch.cuda.is_available is cuda_available and torch.Tensor.to is tensor_to
assert all(getattr(torch, n) is f for n, f in before.items())
assert not torch.cuda.is_initialized()
plugins = [m for m in ("torch_npu", "torch_mlu", "torch_musa", "flag_gems") if m in sys.modules]
assert not plugins, plugins
assert ft.current_backend() is None
assert torch._C._get_privateuse1_backend_name() == "privateuseone"
print("ok")
'''


def test_import_is_free():
    proc = run_python(["-c", CHECK])
    assert proc.stdout.strip() == "ok", proc.stderr


def test_version_outside_tested_range_warns_once_naming_the_range(monkeypatch):
    monkeypatch.setattr(compat, "_warned", set())
    with pytest.warns(UserWarning, match=r"torch 2\.7\.1 is untested with flagos_torchfl \(tested: torch 2\.13\)"):
        compat.check_torch("2.7.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_torch("2.7.1")  # once only
        compat.check_torch("2.13.0+cpu")  # tested: silent


def test_torch_below_the_floor_is_refused():
    with pytest.raises(ImportError, match=r"needs torch>=2\.4; found torch 2\.3\.1"):
        compat.check_torch("2.3.1")


def test_plugin_versions(monkeypatch):
    monkeypatch.setattr(compat, "_warned", set())
    with pytest.warns(UserWarning, match=r"torch_npu 2\.1\.0 is untested with flagos_torchfl \(tested: none yet\)"):
        compat.check_plugin("torch_npu", "2.1.0", ())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_plugin("torch_mlu", "1.24.1", ("1.24",))


def test_newer_api_needs_say_so():
    with pytest.raises(RuntimeError, match=r"the sim device needs torch>=2\.9; this is torch 2\.5\.0"):
        compat.require_torch("the sim device", compat.SIM_MIN_TORCH, "2.5.0")


def test_log_level_from_environment():
    code = "import flagos_torchfl as ft; ft.init_backend('cpu')"
    proc = run_python(["-c", code], env={"FL_LOG_LEVEL": "INFO"})
    assert "[flagos_torchfl] INFO backend cpu active" in proc.stderr
    proc = run_python(["-c", code], env={"FL_LOG_LEVEL": "WARNING"})
    assert "backend cpu active" not in proc.stderr
