"""`detect` and `env` as a user runs them, plus the console script."""
import json
import shutil

import pytest
import torch

from flagos_torchfl import compat
from tests.helpers import run_python

KNOWN = {"cuda", "rocm", "ascend", "cambricon", "mthreads", "xpu", "mps", "cpu", "sim"}


@pytest.fixture(scope="module")
def detect_json():
    proc = run_python(["-m", "flagos_torchfl", "detect", "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_detect_json_lists_every_backend_with_status(detect_json):
    rows = {r["name"]: r for r in detect_json["backends"]}
    assert KNOWN <= set(rows)
    cpu = rows["cpu"]
    assert cpu["status"] == "available" and cpu["native_ops"] > 500 and cpu["device_count"] == 1
    assert cpu["devices"][0]["total_memory"] > 0
    for name in KNOWN - {"cpu", "sim"}:
        assert rows[name]["status"] == "unavailable" and rows[name]["reason"], name
    if compat.has("python_privateuse1_backend"):
        assert rows["sim"]["status"] == "on-request" and rows["sim"]["native_ops"] is None
    else:  # below the sim's own floor
        assert rows["sim"]["status"] == "unavailable"
        assert rows["sim"]["reason"] == f"needs torch>=2.9; this is torch {torch.__version__}"
    assert detect_json["auto_select"]["backend"] == "cpu"
    assert detect_json["torch"] == {"version": torch.__version__, "minimum": "2.1", "sim_minimum": "2.9"}


def test_detect_table_is_readable():
    proc = run_python(["-m", "flagos_torchfl", "detect"], env={"FL_CPU_DEVICES": "2"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["BACKEND", "STATUS"]
    cpu = next(line for line in lines if line.startswith("cpu "))
    assert "available" in cpu and "2 x " in cpu
    assert any(line.startswith("ascend") and "torch_npu is not installed" in line for line in lines)
    sim = "available on request (FL_BACKEND=sim)" if compat.has("python_privateuse1_backend") else \
        "not available: needs torch>=2.9"
    assert any(line.startswith("sim") and sim in line for line in lines)
    assert f"TORCH: {torch.__version__} (flagos_torchfl needs torch>=2.1; the sim device torch>=2.9)" in lines
    assert "auto_select_backend() would pick: cpu" in proc.stdout


def test_detect_reports_what_auto_would_do_with_fl_backend():
    proc = run_python(["-m", "flagos_torchfl", "detect", "--json"], env={"FL_BACKEND": "ascend"})
    pick = json.loads(proc.stdout)["auto_select"]
    assert pick["backend"] is None and "torch_npu is not installed" in pick["why"]


def test_env_report():
    proc = run_python(["-m", "flagos_torchfl", "env"], env={"FL_BACKEND": "cpu"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    import torch

    assert f"torch version: {torch.__version__}" in out
    assert "torch_npu version: not installed" in out and "FL_BACKEND=cpu" in out
    assert "- auto_select_backend(): cpu" in out


def test_console_script_and_help():
    import sysconfig

    exe = shutil.which("flagos-torchfl", path=sysconfig.get_path("scripts"))
    if exe is None:
        pytest.fail("the flagos-torchfl console script is not installed (pip install -e .)")
    import subprocess

    proc = subprocess.run([exe, "detect", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["auto_select"]["backend"] == "cpu"
    proc = run_python(["-m", "flagos_torchfl"])
    assert proc.returncode == 2 and "detect" in proc.stdout
