"""autoload.py's parts: requirement matching, the missing library in an ImportError, the
component that ships it, the command-line test, and the guard in an interpreter without torch."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from flagos_torchfl import autoload
from flagos_torchfl.compat import parse_version
from tests.helpers import ROOT, prepend_path, run_python


@pytest.mark.parametrize("version, spec, expected", [
    ("2.13.0+cpu", "==2.13.0.*", True), ("2.13.0", "==2.14.0.*", False), ("2.13.1", "==2.13.*", True),
    ("2.13.0", ">=2.4,<2.14", True), ("2.14.0", ">=2.4,<2.14", False), ("2.13.0", "!=2.13.0", False),
    ("2.13.0", "~=2.12", True), ("3.0", "~=2.12", False), ("2.13.0", "==2.13", True),
])
def test_requirement_matching(version, spec, expected):
    assert autoload.satisfies(version, spec) is expected


def test_the_missing_library_is_read_from_the_error():
    assert autoload.missing_library("ImportError: libhccl.so: cannot open shared object file: No such file") \
        == "libhccl.so"
    assert autoload.missing_library("OSError: libcnrt.so.6: cannot open shared object file") == "libcnrt.so"
    assert autoload.missing_library("ImportError: undefined symbol: _ZN3c10") is None


@pytest.mark.parametrize("module, library, component, variable", [
    ("torch_npu", "libascendcl.so", "the CANN toolkit", "ASCEND_TOOLKIT_HOME"),
    ("torch_npu", "libatb.so", "the NNAL package", "ATB_HOME_PATH"),
    ("torch_mlu", "libcncl.so", "Neuware SDK", "NEUWARE_HOME"),
    ("torch_musa", "libmudnn.so", "the MUSA toolkit with muDNN and MCCL", "MUSA_HOME"),
])
def test_each_library_names_its_component_and_the_state_of_its_variables(module, library, component, variable):
    unset = autoload.ships(module, library, environ={})
    assert component in unset and f"{variable} is not set" in unset and "LD_LIBRARY_PATH is not set" in unset
    folder = {"torch_npu": "/usr/local/Ascend/lib64", "torch_mlu": "/usr/local/neuware/lib64",
              "torch_musa": "/usr/local/musa/lib"}[module]
    found = autoload.ships(module, library, environ={variable: "/x", "LD_LIBRARY_PATH": f"/a:{folder}"})
    assert f"{variable}=/x" in found and f"LD_LIBRARY_PATH has {folder}" in found
    assert "No vendor component is known for libnothing.so" in autoload.ships(module, "libnothing.so", {})


@pytest.mark.parametrize("argv, expected", [
    (["python", "-m", "flagos_torchfl", "detect"], True), (["python", "-X", "importtime", "-mflagos_torchfl"], True),
    (["python", "-W", "ignore", "-m", "flagos_torchfl"], True), (["python", "-m", "pytest"], False),
    (["python", "-c", "import flagos_torchfl"], False), (["python", "train.py"], False),
])
def test_the_command_line_is_recognised_from_the_interpreters_arguments(argv, expected):
    assert autoload.started_as_command(argv) is expected


def test_guard_without_plugins_records_that_and_keeps_the_users_choice():
    code = textwrap.dedent(f"""
        import json, sys
        from importlib.util import module_from_spec, spec_from_file_location
        spec = spec_from_file_location("guard", {str(ROOT / "src" / "flagos_torchfl" / "autoload.py")!r})
        guard = module_from_spec(spec); spec.loader.exec_module(guard)
        env = {{}}
        first = guard.guard(env)
        again = guard.guard(env)  # a child with the parent's record decides nothing again
        users = {{"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}}
        print(json.dumps([first, again is not None, env, guard.guard(users), users, "torch" in sys.modules]))
    """)
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    first, again, env, users_record, users_env, torch_imported = json.loads(proc.stdout)
    assert first["plugins"] == {} and first["disabled"] is False and again
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in env and json.loads(env["FL_PLUGIN_AUTOLOAD"]) == first
    assert users_record is None and users_env == {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    assert torch_imported is False


def fake_plugin(folder, name, body):
    """A device plugin distribution ``name`` in ``folder`` whose import runs ``body``."""
    (folder / name).mkdir()
    (folder / name / "__init__.py").write_text(textwrap.dedent(body) + "\ndef load():\n    pass\n")
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[torch.backends]\n{name} = {name}:load\n")


GUARD = f"""
    import json, os, sys
    from importlib.util import module_from_spec, spec_from_file_location
    spec = spec_from_file_location("guard", {str(ROOT / "src" / "flagos_torchfl" / "autoload.py")!r})
    guard = module_from_spec(spec); spec.loader.exec_module(guard)
"""


def test_a_plugin_the_program_imported_is_not_refused_for_a_recorded_failure(tmp_path, monkeypatch):
    import importlib
    import os
    import sys

    import torch

    from flagos_torchfl.backends.base import Unavailable
    from tests.helpers import chip

    (tmp_path / "late_plugin.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "late_plugin", raising=False)
    entry = {"reason": "late_plugin cannot load: libfake.so is missing", "timed_out": False}
    monkeypatch.setenv("FL_PLUGIN_AUTOLOAD", json.dumps({
        "python": sys.executable, "library_path": os.environ.get("LD_LIBRARY_PATH", ""),
        "disabled": True, "plugins": {"late_plugin": entry}}))
    backend = chip("late", "cpu", plugin_module="late_plugin")
    with pytest.raises(Unavailable, match="libfake.so is missing"):  # not imported: the record holds
        backend.load_runtime(5)
    importlib.import_module("late_plugin")  # the program imported it itself
    assert backend.load_runtime(5) is torch.cpu


def test_a_probe_that_timed_out_is_no_verdict_and_the_load_is_tried_again(tmp_path):
    # faults injected: one plugin outlasts FL_PROBE_TIMEOUT in the probe, another fails outright
    fake_plugin(tmp_path, "slow_plugin", "import os, time\ntime.sleep(float(os.environ['SLOW_PLUGIN_SLEEP']))")
    fake_plugin(tmp_path, "broken_plugin", "raise ImportError('libbroken.so: cannot open shared object file')")
    code = textwrap.dedent(GUARD) + textwrap.dedent("""
        record = guard.guard(os.environ)
        os.environ["SLOW_PLUGIN_SLEEP"] = "0"  # the hang was passing: this process loads it
        from flagos_torchfl.backends.base import Unavailable
        from tests.helpers import chip
        loaded = chip("slow", "cpu", plugin_module="slow_plugin").load_runtime(10) is not None
        try:
            chip("broken", "cpu", plugin_module="broken_plugin").load_runtime(10)
            broken = None
        except Unavailable as exc:
            broken = exc.reason
        print(json.dumps([record, guard.plugin_problem("slow_plugin"), loaded, broken]))
    """)
    env = prepend_path({"SLOW_PLUGIN_SLEEP": "60", "FL_PROBE_TIMEOUT": "2"}, "PYTHONPATH", tmp_path)
    proc = run_python(["-c", code], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record, slow_problem, loaded, broken = json.loads(proc.stdout.splitlines()[-1])
    slow, bad = record["plugins"]["slow_plugin"], record["plugins"]["broken_plugin"]
    assert slow["timed_out"] is True and "did not finish within 2 s" in slow["error"]
    assert bad["timed_out"] is False and record["disabled"] is True
    assert slow_problem is None and loaded is True
    assert broken is not None and "libbroken.so is missing" in broken


def test_a_child_with_another_library_path_probes_again(tmp_path):
    # fault injected: a plugin that loads only where LD_LIBRARY_PATH has its folder
    fake_plugin(tmp_path, "ldpath_plugin", """
        import os
        if "/fl-vendor/lib" not in os.environ.get("LD_LIBRARY_PATH", ""):
            raise ImportError("libvendor.so: cannot open shared object file")
    """)
    code = textwrap.dedent(GUARD) + textwrap.dedent("""
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        first = guard.guard(env)
        env["LD_LIBRARY_PATH"] = "/fl-vendor/lib"  # a child started with the vendor's libraries
        second = guard.guard(env)
        print(json.dumps([first["disabled"], second["disabled"], "TORCH_DEVICE_BACKEND_AUTOLOAD" in env,
                          second["plugins"]["ldpath_plugin"]["error"]]))
    """)
    proc = run_python(["-c", code], env=prepend_path({}, "PYTHONPATH", tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [True, False, False, None]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_ctrl_c_during_the_probe_kills_the_probe(tmp_path):
    # fault injected: a plugin hangs in the probe and the user presses Ctrl-C meanwhile
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import clean_env

    marker = tmp_path / "probe.pid"
    fake_plugin(tmp_path, "stuck_plugin", f"""
        import os, time
        open({str(marker)!r}, "w").write(str(os.getpid()))
        time.sleep(1200)
    """)
    code = textwrap.dedent(GUARD) + "guard.guard(dict(os.environ))\n"
    env = clean_env(prepend_path({"FL_PROBE_TIMEOUT": "900"}, "PYTHONPATH", tmp_path))
    # Ctrl-C in a terminal: SIGINT at its default, whatever this process inherited (a shell's
    # background job, as CI may run the suite, ignores SIGINT, and Python keeps an ignored SIGINT)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    probe = None
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        probe = int(marker.read_text())
        proc.send_signal(signal.SIGINT)
        # the waits below only guard against a hang: the probe's own timeout is 900 s away
        _, err = proc.communicate(timeout=300)
        assert "KeyboardInterrupt" in err
        deadline = time.monotonic() + 120
        while _alive(probe) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(probe), "the probe outlived the interrupted guard"
    finally:
        proc.kill()
        if probe is not None and _alive(probe):
            os.kill(probe, signal.SIGKILL)


@pytest.mark.skipif(parse_version(torch.__version__.split("+")[0]) < (2, 5),
                    reason="torch auto-loads device plugins from 2.5 on: before, nothing loads odd_plugin")
def test_a_failing_plugin_check_warns_once_and_the_program_goes_on(tmp_path):
    # fault injected: a device plugin whose METADATA is not UTF-8; torch loads the plugin itself
    # (it reads only entry_points.txt), the start-up check cannot read the distribution
    (tmp_path / "odd_plugin.py").write_text("LOADED = []\ndef load():\n    LOADED.append(1)\n")
    info = tmp_path / "odd_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: odd_plugin\nSummary: \xff\xfe\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nodd_plugin = odd_plugin:load\n")
    env = prepend_path({"FL_ACTIVATE": "1", "FL_BACKEND": "cpu"}, "PYTHONPATH", tmp_path)
    prepend_path(env, "PYTHONPATH", ROOT / "src" / "flagos_torchfl" / "bootstrap")
    proc = run_python(["-c", "import torch, odd_plugin; x = torch.ones(2, device='cuda'); print(odd_plugin.LOADED, x.sum().item())"],
                      env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[1]", "2.0"]
    lines = [line for line in proc.stderr.splitlines() if "device-plugin check failed" in line]
    assert len(lines) == 1 and "UnicodeDecodeError" in lines[0], proc.stderr
