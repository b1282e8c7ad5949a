"""The launcher's parts on their own: importing never activates, how a command line is read,
the environment it prepares, and the report hook."""
import os
import re
import sys

import pytest

from flagos_torchfl import startup
from flagos_torchfl.cli.run import (
    Command, Module, Script, UsageError, parse_target, validate_backend, validate_log_level,
)
from tests.helpers import run_python

NOT_ACTIVE = '''
import sys, flagos_torchfl, flagos_torchfl.startup, flagos_torchfl.cli.run, torch
watchers = [f for f in sys.meta_path if type(f).__name__ == "_ImportWatcher"]
print(flagos_torchfl.current_backend(), len(watchers))
'''


@pytest.mark.full
def test_importing_flagos_torchfl_never_activates():
    proc = run_python(["-c", NOT_ACTIVE], env={"FL_BACKEND": "cpu"})
    assert proc.stdout.split() == ["None", "0"], proc.stderr


@pytest.mark.full
def test_bootstrap_on_pythonpath_without_fl_activate_does_nothing():
    env = {"FL_BACKEND": "cpu", "PYTHONPATH": startup.BOOTSTRAP_DIR}
    proc = run_python(["-c", NOT_ACTIVE], env=env)
    assert proc.stdout.split() == ["None", "0"], proc.stderr


def test_scripts_modules_and_commands_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "train").write_text("")  # not executable: `python train` would run it
    assert parse_target(None, ["train.py", "-x"]) == Script("train.py", ["-x"])
    assert parse_target(None, ["--", "train.py"]) == Script("train.py", [])
    assert parse_target(None, ["train"]) == Script("train", [])
    assert parse_target(["json.tool", "-h"], []) == Module("json.tool", ["-h"])
    (tmp_path / "local_tool.py").write_text("")
    assert parse_target(["local_tool"], []) == Module("local_tool", [])
    command = parse_target(None, ["--", sys.executable, "-c", "pass"])
    assert command == Command(sys.executable, [sys.executable, "-c", "pass"])
    assert isinstance(parse_target(None, ["sh", "-c", "exit 0"]), Command)


@pytest.mark.parametrize("module, program, message", [
    ([], [], "-m needs a module name"),
    (None, ["--"], "nothing to run"),
    (None, ["absent.py"], "cannot open script 'absent.py'"),
    (["not_a_module_xyz.sub"], [], "no module named 'not_a_module_xyz'"),
    (None, ["not-a-command-xyz"], "neither a Python script (*.py) nor a command found on PATH"),
])
def test_unrunnable_targets_are_usage_errors(tmp_path, monkeypatch, module, program, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_target(module, program)


def test_backend_and_log_level_options_are_validated():
    assert validate_backend(" Huawei,host ") == ["ascend", "cpu"]
    with pytest.raises(UsageError, match=r"unknown --backend value 'cdua'\. Did you mean 'cuda'\? Valid names: .*cpu"):
        validate_backend("cdua")
    with pytest.raises(UsageError, match="--backend is empty"):
        validate_backend(" ")
    assert validate_log_level("debug") == "DEBUG" and validate_log_level("15") == "15"
    with pytest.raises(UsageError, match="invalid --log-level 'loud'.*Valid levels: DEBUG, INFO"):
        validate_log_level("loud")


def test_prepared_environment_puts_the_bootstrap_first_once():
    env = {"PYTHONPATH": os.pathsep.join(["/user/lib", startup.BOOTSTRAP_DIR])}
    startup.prepare_environment(env, ["ascend", "cpu"], "DEBUG", report=True)
    startup.prepare_environment(env)
    assert env["PYTHONPATH"].split(os.pathsep) == [startup.BOOTSTRAP_DIR, "/user/lib"]
    assert env["FL_ACTIVATE"] == "1" and env["FL_BACKEND"] == "ascend,cpu"
    assert env["FL_BACKEND_FROM_LAUNCHER"] == "1"
    assert env["FL_LOG_LEVEL"] == "DEBUG" and env["FL_RUN_REPORT"] == "1"
    assert os.path.isfile(os.path.join(startup.BOOTSTRAP_DIR, "sitecustomize.py"))


def test_report_is_the_routing_layers_rendering_on_stderr(capsys):
    from flagos_torchfl.routing.report import render

    startup.print_report()
    assert capsys.readouterr() == ("", render() + "\n")
