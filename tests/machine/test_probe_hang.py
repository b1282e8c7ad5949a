"""A vendor plugin whose import hangs is abandoned within the probe timeout.

Its own process: the abandoned import keeps the module's import lock for good. The plugins and
tools hang for 600 s: a call that returns within 300 s did not wait for them, however slow or
loaded the machine.
"""
import time

import pytest

from flagos_torchfl.backends import registry
from tests.helpers import prepend_path, run_python

pytestmark = pytest.mark.isolated


def test_plugin_that_hangs_on_import_is_abandoned_in_bounded_time(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "torch_musa.py").write_text("import time\ntime.sleep(600)\n")
    start = time.monotonic()
    result = registry().get("mthreads").probe(timeout=1.0)
    assert time.monotonic() - start < 300
    assert result.reason == "importing torch_musa did not finish within 1 s"


def test_detect_with_a_hanging_plugin_and_tool_finishes(tmp_path):
    (tmp_path / "torch_npu.py").write_text("import time\ntime.sleep(600)\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "npu-smi"
    tool.write_text("#!/bin/sh\nsleep 600\n")
    tool.chmod(0o755)
    env = prepend_path({"FL_PROBE_TIMEOUT": "1"}, "PYTHONPATH", tmp_path)
    prepend_path(env, "PATH", bin_dir)
    start = time.monotonic()
    proc = run_python(["-m", "flagos_torchfl", "detect"], env=env, timeout=400)
    assert time.monotonic() - start < 300
    assert proc.returncode == 0, proc.stderr
    assert "importing torch_npu did not finish within 1 s" in proc.stdout
