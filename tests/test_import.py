"""Importing is free: no device initialised, no vendor plugin imported, nothing patched."""
import warnings

import pytest

from flagos_torchfl import compat
from tests.helpers import prepend_path, run_python

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
    with pytest.warns(UserWarning, match=r"torch 2\.7\.1 is untested with flagos_torchfl \(tested: torch 2\.1, 2\.13, 2\.14\)"):
        compat.check_torch("2.7.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_torch("2.7.1")  # once only
        compat.check_torch("2.13.0+cpu")  # tested: silent


def test_torch_below_the_floor_is_refused():
    with pytest.raises(ImportError, match=r"^flagos_torchfl needs torch>=2\.1 \(the sim device torch>=2\.9\); "
                                          r"this is torch 2\.0\.1$"):
        compat.check_torch("2.0.1")
    compat.check_torch("2.1.0")  # the floor itself


BELOW_FLOOR = "import torch\ntorch.__version__ = '2.0.1'\n"


@pytest.mark.parametrize("how", ["module", "import"])
def test_below_the_floor_the_command_line_says_one_sentence(how, tmp_path):
    """Injected: torch reports 2.0.1. The command line prints one sentence and exits 1, with no
    traceback; a program importing the package gets an ImportError saying the same."""
    (tmp_path / "sitecustomize.py").write_text(BELOW_FLOOR)
    env = prepend_path({}, "PYTHONPATH", tmp_path)
    args = ["-m", "flagos_torchfl", "detect"] if how == "module" else ["-c", "import flagos_torchfl"]
    proc = run_python(args, env=env)
    assert proc.returncode == 1
    sentence = "flagos_torchfl needs torch>=2.1 (the sim device torch>=2.9); this is torch 2.0.1"
    if how == "module":
        assert proc.stderr.strip().splitlines() == [sentence]
    else:
        assert f"ImportError: {sentence}" in proc.stderr


def test_feature_table_matches_this_torch():
    """Every detected internal answers here what the table says it answered on this release."""
    import torch

    version = torch.__version__.split("+")[0]
    for feature in compat.FEATURES.values():
        if version in feature.checked:
            assert compat.has(feature.name) == feature.checked[version], (feature.name, version)
    with pytest.raises(KeyError, match="unknown torch feature 'acelerator'; known: .*accelerator"):
        compat.has("acelerator")


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


def test_sim_below_its_floor_says_so_in_detect_and_at_start(monkeypatch):
    """Injected: a torch without the Python PrivateUse1 backend API the sim needs."""
    import dataclasses

    import torch

    from flagos_torchfl.backends import get_backend
    from flagos_torchfl.errors import BackendUnavailableError

    feature = compat.FEATURES["python_privateuse1_backend"]
    monkeypatch.setitem(compat.FEATURES, feature.name, dataclasses.replace(feature, probe=lambda: False))
    compat.has.cache_clear()
    try:
        result = get_backend("sim").probe()
        assert (result.status, result.reason) == ("unavailable", f"needs torch>=2.9; this is torch {torch.__version__}")
        with pytest.raises(BackendUnavailableError, match=r"backend 'sim' is not available: needs torch>=2\.9"):
            get_backend("sim").start(None)
    finally:
        compat.has.cache_clear()
