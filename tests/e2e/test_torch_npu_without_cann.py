"""The real Ascend plugin, torch-npu 2.13.0 from the package index, on a machine without the CANN
toolkit: torch's auto-load of it fails, and the package's command line, launcher and launched
children say why instead of crashing. The 2.14.0 wheel (which pins torch 2.14.0) is the
version-mismatch case. The wheels are installed into side folders (tests/wheels.py)."""
from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch

from flagos_torchfl.compat import parse_version
from tests.helpers import ROOT, prepend_path, run_python
from tests.wheels import site

TRAIN = str(ROOT / "examples" / "train_cuda.py")
TORCH = torch.__version__.split("+")[0]
pytestmark = pytest.mark.skipif(parse_version(TORCH) < (2, 5),
                                reason="torch auto-loads device plugins from 2.5 on")


@pytest.fixture(scope="module")
def npu213():
    return site("torch-npu", "2.13.0")


@pytest.fixture(scope="module")
def npu214():
    return site("torch-npu", "2.14.0")


def with_plugin(folder, **extra):
    return prepend_path(dict(extra), "PYTHONPATH", folder)


def cli(args, env, timeout=300):
    return run_python(["-m", "flagos_torchfl", *args], env=env, timeout=timeout)


def ascend_row(data):
    return next(row for row in data["backends"] if row["name"] == "ascend")


def test_plain_import_torch_fails_with_the_wheel_installed(npu213):
    # the fault is real: torch's own auto-load of torch_npu dies on the missing CANN library
    proc = run_python(["-c", "import torch"], env=with_plugin(npu213))
    assert proc.returncode == 1
    assert "libhccl.so: cannot open shared object file" in proc.stderr
    assert "Failed to load the backend extension: torch_npu" in proc.stderr


def test_detect_names_the_missing_library_and_cann(npu213):
    proc = cli(["detect", "--json"], with_plugin(npu213))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    row = ascend_row(data)
    assert row["status"] == "unavailable"
    for words in ("torch_npu 2.13.0", "libhccl.so is missing", "the CANN toolkit",
                  "source /usr/local/Ascend/ascend-toolkit/set_env.sh", "ASCEND_TOOLKIT_HOME is not set"):
        assert words in row["reason"], row["reason"]
    assert set(data["autoload_disabled_for"]) == {"torch_npu"}
    assert data["auto_select"]["backend"] == "cpu"

    text = cli(["detect"], with_plugin(npu213, ASCEND_TOOLKIT_HOME="/opt/nowhere",
                                       LD_LIBRARY_PATH="/opt/other/lib"))
    assert text.returncode == 0, text.stderr
    out = " ".join(text.stdout.split())
    assert "ascend not available (note 1)" in out
    assert "ASCEND_TOOLKIT_HOME=/opt/nowhere; LD_LIBRARY_PATH has no Ascend folder" in out
    assert "A plain `python train.py` fails inside `import torch`" in out


def test_run_under_auto_trains_on_cpu_with_one_warning_and_children_inherit(npu213, tmp_path):
    script = tmp_path / "train_and_spawn.py"
    script.write_text(textwrap.dedent(f"""
        import runpy, subprocess, sys
        runpy.run_path({TRAIN!r}, run_name="__main__")
        code = ("import os, torch; print('child', torch.cuda.is_available(), torch.ones(1).cuda().device.type, "
                "os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'])")
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        print(child.stdout.strip(), "| child stderr:", child.stderr.strip() or "-")
        sys.exit(child.returncode)
    """))
    proc = cli(["run", str(script)], with_plugin(npu213))
    assert proc.returncode == 0, proc.stderr
    assert "step 15 loss" in proc.stdout
    assert "device: " in proc.stdout and "(1 visible)" in proc.stdout
    assert "child True cpu 0 | child stderr: -" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, proc.stderr
    assert "running on cpu: ascend skipped" in warnings[0]
    assert "libhccl.so is missing" in warnings[0] and "CANN toolkit" in warnings[0]


def test_fl_backend_ascend_exits_1_naming_cann_without_traceback(npu213, tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\nimport torch\n")
    for env in ({"FL_BACKEND": "ascend"}, {}):
        args = ["run", str(script)] if env else ["run", "--backend", "ascend", str(script)]
        proc = cli(args, with_plugin(npu213, **env))
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr
        assert proc.stderr.startswith("flagos_torchfl: cannot activate backend ascend: BackendUnavailableError")
        assert "libhccl.so is missing" in proc.stderr and "the CANN toolkit" in proc.stderr
        assert not marker.exists()


def test_failed_activation_leaves_nothing_behind_and_the_users_autoload_is_kept(npu213):
    code = textwrap.dedent("""
        import os, sys, torch
        real_cuda, real_to = torch.cuda, torch.Tensor.to
        import flagos_torchfl as ft
        try:
            ft.init_backend("ascend")
        except ft.BackendUnavailableError as exc:
            print("error:", exc)
        print("active:", ft.current_backend())
        print("same torch:", torch.cuda is real_cuda and torch.Tensor.to is real_to and not torch.cuda.is_available())
        print("privateuse1:", torch._C._get_privateuse1_backend_name())
        print("autoload:", os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"], "record:", "FL_PLUGIN_AUTOLOAD" in os.environ)
        print("then:", ft.init_backend("cpu").backend, torch.ones(1).cuda().device.type)
    """)
    proc = run_python(["-c", code], env=with_plugin(npu213, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # the user turned the auto-load off: the plugin is imported here, and its error explained
    assert "error: backend 'ascend' is not available: torch_npu 2.13.0 cannot load: libhccl.so is missing" in out
    assert "the CANN toolkit" in out
    assert "active: None" in out and "same torch: True" in out and "privateuse1: privateuseone" in out
    assert "autoload: 0 record: False" in out
    assert "then: cpu cpu" in out


def test_users_own_autoload_choice_is_not_overridden(npu213):
    # TORCH_DEVICE_BACKEND_AUTOLOAD=1 set by the user: torch auto-loads, and fails, as they asked
    proc = cli(["detect"], with_plugin(npu213, TORCH_DEVICE_BACKEND_AUTOLOAD="1"))
    assert proc.returncode == 1
    assert "Failed to load the backend extension: torch_npu" in proc.stderr


def test_version_mismatch_is_read_from_the_plugins_metadata(npu214):
    proc = cli(["detect", "--json"], with_plugin(npu214))
    assert proc.returncode == 0, proc.stderr
    reason = ascend_row(json.loads(proc.stdout))["reason"]
    assert reason.startswith(f"torch_npu 2.14.0 requires torch==2.14.0.* but torch {TORCH} is installed"), reason
    assert "libhccl.so is missing" in reason
    run = cli(["run", "--backend", "ascend", TRAIN], with_plugin(npu214))
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "requires torch==2.14.0.*" in run.stderr


def test_a_hanging_plugin_is_bounded_by_the_probe_timeout(tmp_path):
    # fault injected: a device plugin whose import never returns
    (tmp_path / "hang_plugin").mkdir()
    (tmp_path / "hang_plugin" / "__init__.py").write_text("import time\ntime.sleep(600)\n")
    info = tmp_path / "hang_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hang_plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nhang_plugin = hang_plugin:load\n")
    proc = cli(["detect", "--json"], with_plugin(tmp_path, FL_PROBE_TIMEOUT="3"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    reason = json.loads(proc.stdout)["autoload_disabled_for"]["hang_plugin"]
    assert "loading hang_plugin did not finish within 3 s (FL_PROBE_TIMEOUT)" in reason
