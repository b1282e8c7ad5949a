"""Probing never crashes and never hangs: faults injected at the boundary become reasons.

Fake vendor plugins (modules on sys.path) and fake query tools (executables on PATH) stand in for
the vendors' own; importing a plugin changes torch for the process, hence the isolation.
"""
import os
import stat
import sys
import time

import pytest

from flagos_torchfl.backends import registry
from flagos_torchfl.backends.cpu import logical_device_count
from flagos_torchfl.errors import ConfigError

pytestmark = pytest.mark.isolated

FAKE_PLUGIN_WITH_DEVICES = '''
import types, torch
__version__ = "{version}"
class _Props:
    def __init__(self, i):
        self.name, self.total_memory = "{chip} #%d" % i, (32 << 30)
mod = types.ModuleType("torch.{device}")
mod.device_count = lambda: {count}
mod.get_device_properties = _Props
mod.get_device_name = lambda i=0: _Props(i).name
torch.{device} = mod
'''


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder at the front of sys.path for fake vendor plugins; cleaned from sys.modules after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    import torch

    for name in set(sys.modules) - before:
        if name.startswith(("torch_npu", "torch_mlu", "torch_musa")):
            del sys.modules[name]
    for device in ("npu", "mlu", "musa"):
        if hasattr(torch, device):
            delattr(torch, device)


@pytest.fixture
def tool_dir(tmp_path, monkeypatch):
    """A folder at the front of PATH for fake vendor query tools."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


def write_tool(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_missing_plugin_is_named():
    result = registry().get("ascend").probe()
    assert not result.available and result.reason == "torch_npu is not installed"
    assert registry().get("cambricon").probe().reason == "torch_mlu is not installed"
    assert registry().get("mthreads").probe().reason == "torch_musa is not installed"


def test_plugin_that_raises_on_import(plugin_dir):
    (plugin_dir / "torch_npu.py").write_text(
        "raise ImportError('libascendcl.so: cannot open shared object file')\n")
    result = registry().get("ascend").probe()
    assert result.status == "unavailable"
    assert result.reason.startswith(
        "torch_npu cannot load: libascendcl.so is missing (importing torch_npu failed: ImportError: "
        "libascendcl.so: cannot open shared object file). It ships with the CANN toolkit: ")


def test_plugin_reporting_devices_makes_the_backend_available(plugin_dir, tool_dir):
    (plugin_dir / "torch_npu.py").write_text(
        FAKE_PLUGIN_WITH_DEVICES.format(version="2.5.1", chip="Ascend910B", device="npu", count=2))
    write_tool(tool_dir, "npu-smi", "echo '| npu-smi 24.1.rc2          Version: 24.1.rc2 |'")
    result = registry().get("ascend").probe()
    assert result.status == "available", result.reason
    assert [d.name for d in result.devices] == ["Ascend910B #0", "Ascend910B #1"]
    assert result.devices[0].total_memory == 32 << 30
    assert result.driver == "24.1.rc2" and result.runtime == "2.5.1"
    assert isinstance(result.native_ops, int)


def test_zero_devices_visible(plugin_dir):
    (plugin_dir / "torch_mlu.py").write_text(
        FAKE_PLUGIN_WITH_DEVICES.format(version="1.24.0", chip="MLU370", device="mlu", count=0))
    assert registry().get("cambricon").probe().reason == "0 devices visible"


def test_device_query_that_raises(plugin_dir):
    (plugin_dir / "torch_mlu.py").write_text(
        "import types, torch\nm = types.ModuleType('torch.mlu')\n"
        "def device_count():\n    raise RuntimeError('cnrtGetDeviceCount: driver mismatch')\n"
        "m.device_count = device_count\ntorch.mlu = m\n")
    reason = registry().get("cambricon").probe().reason
    assert reason == "querying torch.mlu devices failed: RuntimeError: cnrtGetDeviceCount: driver mismatch"


def test_plugin_without_device_module(plugin_dir):
    (plugin_dir / "torch_musa.py").write_text("__version__ = '1.3.0'\n")
    assert registry().get("mthreads").probe().reason == "torch_musa provides no torch.musa module"


def test_no_nvidia_driver(tool_dir, monkeypatch):
    monkeypatch.setenv("PATH", str(tool_dir))  # no nvidia-smi anywhere
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("this machine has an NVIDIA kernel driver")
    result = registry().get("cuda").probe()
    assert result.reason == "no NVIDIA driver found"
    assert result.notes == []  # no driver: its query tool is not even looked for


def test_cpu_build_with_driver_present(tool_dir, monkeypatch):
    monkeypatch.setattr("torch.version.cuda", None)  # a CUDA wheel of torch must not change the answer
    write_tool(tool_dir, "nvidia-smi", "echo 550.54.15")
    result = registry().get("cuda").probe()
    assert result.driver == "550.54.15"
    assert result.reason == "torch was built without CUDA"


def test_hanging_query_tool_is_bounded(tool_dir, monkeypatch):
    monkeypatch.setattr("torch.version.cuda", None)
    write_tool(tool_dir, "nvidia-smi", "sleep 600")
    start = time.monotonic()
    result = registry().get("cuda").probe(timeout=1.0)
    assert time.monotonic() - start < 300  # did not wait for the tool's 600 s, however slow the machine
    assert "nvidia-smi did not answer within 1 s" in result.notes
    assert result.reason == "torch was built without CUDA"


def test_garbage_from_query_tool(tool_dir):
    write_tool(tool_dir, "nvidia-smi", "printf '\\001\\002 NVML: ??? \\377'")
    result = registry().get("cuda").probe()
    assert result.driver is None
    assert any("could not read a driver version from `nvidia-smi" in n for n in result.notes)


def test_failing_query_tool(tool_dir):
    write_tool(tool_dir, "rocm-smi", "echo 'ERROR: GPU driver not loaded' >&2; exit 3")
    result = registry().get("rocm").probe()
    assert "rocm-smi exited with code 3: ERROR: GPU driver not loaded" in result.notes
    assert result.reason == "torch was built without ROCm (HIP)"


def test_no_rocm_driver(tool_dir, monkeypatch):
    monkeypatch.setenv("PATH", str(tool_dir))
    if os.path.exists("/dev/kfd"):
        pytest.skip("this machine has an AMD kernel driver")
    assert registry().get("rocm").probe().reason == "no AMD ROCm driver found"


def test_xpu_and_mps_reasons():
    assert registry().get("xpu").probe().reason == "torch was built without XPU support"
    if sys.platform != "darwin":
        assert registry().get("mps").probe().reason.startswith("MPS needs macOS on Apple silicon")


def test_cuda_visible_devices_is_translated_for_the_vendor(plugin_dir, monkeypatch):
    (plugin_dir / "torch_npu.py").write_text(
        "import os, types, torch\nseen = os.environ.get('ASCEND_RT_VISIBLE_DEVICES')\n"
        "m = types.ModuleType('torch.npu')\nm.device_count = lambda: 0\ntorch.npu = m\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    registry().get("ascend").probe()
    assert sys.modules["torch_npu"].seen == "2,3"  # set before the runtime started
    assert "ASCEND_RT_VISIBLE_DEVICES" not in os.environ  # restored after the probe


def test_cpu_logical_devices(monkeypatch):
    assert logical_device_count("FL_CPU_DEVICES", {}) == 1
    assert logical_device_count("FL_CPU_DEVICES", {"LOCAL_WORLD_SIZE": "4"}) == 4
    assert logical_device_count("FL_CPU_DEVICES", {"FL_CPU_DEVICES": "3", "LOCAL_WORLD_SIZE": "4"}) == 3
    with pytest.raises(ConfigError, match="FL_CPU_DEVICES='0' is not valid"):
        logical_device_count("FL_CPU_DEVICES", {"FL_CPU_DEVICES": "0"})
    monkeypatch.setenv("FL_CPU_DEVICES", "2")
    result = registry().get("cpu").probe()
    assert result.available and [d.index for d in result.devices] == [0, 1]
    monkeypatch.setenv("FL_CPU_DEVICES", "two")
    assert "FL_CPU_DEVICES='two' is not valid" in registry().get("cpu").probe().reason


def test_cpu_operator_count_is_read_from_the_dispatcher():
    import torch

    result = registry().get("cpu").probe()
    expected = sum(
        1 for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, "CPU"))
    assert result.native_ops == expected > 500
