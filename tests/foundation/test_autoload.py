"""autoload.py's parts: requirement matching, the missing library in an ImportError, the
component that ships it, the command-line test, and the guard in an interpreter without torch."""
from __future__ import annotations

import json
import textwrap

import pytest

from flagos_torchfl import autoload
from tests.helpers import ROOT, run_python


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
