"""Bad input is a ConfigError naming the value, raised before anything is touched; raw errors
(tracebacks, UnicodeDecodeError, TypeError, FileNotFoundError) never reach the user."""
import os

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl import config
from flagos_torchfl.cli import env as env_cli
from flagos_torchfl.errors import ConfigError
from tests.helpers import no_activation, run_python  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_activation")


def assert_untouched():
    assert ft.current_backend() is None
    assert not torch.cuda.is_available()  # still torch's own torch.cuda


@pytest.mark.parametrize("variable, value", [
    ("FL_PROBE_TIMEOUT", "inf"), ("FL_PROBE_TIMEOUT", "1e300"), ("FL_PROBE_TIMEOUT", "-1"),
    ("FL_PROBE_TIMEOUT", "nan"), ("FL_LOG_LEVEL", "bogus"), ("FL_SIM_DEVICES", "\u0663"),
    ("FL_CPU_DEVICES", "100000000"), ("FL_MEMORY_VIRTUAL_LIMIT", "\uff14\uff10GiB"),
    ("LOCAL_WORLD_SIZE", "1000"), ("LOCAL_WORLD_SIZE", "\u0663"),
])
def test_bad_variable_stops_activation_before_anything_changes(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable if variable != "FL_MEMORY_VIRTUAL_LIMIT" else "memory_virtual_limit"):
        ft.auto_select_backend()
    assert_untouched()


@pytest.mark.full
@pytest.mark.parametrize("value", ["inf", "1e300"])
def test_detect_and_env_with_a_bad_timeout_print_one_line_and_fail(value):
    for command in ("detect", "env"):
        proc = run_python(["-m", "flagos_torchfl", command], env={"FL_PROBE_TIMEOUT": value}, timeout=120)
        assert proc.returncode == 2
        assert f"flagos-torchfl {command}: error: FL_PROBE_TIMEOUT='{value}' is not valid" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.needs_sim
def test_misconfigured_backend_in_an_ordered_list_is_an_error_not_skipped(monkeypatch):
    monkeypatch.setenv("FL_BACKEND", "sim,cpu")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")  # sim's device count comes from it
    with pytest.raises(ConfigError, match="backend 'sim' is misconfigured: LOCAL_WORLD_SIZE='0'"):
        ft.auto_select_backend()
    assert_untouched()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("FL_SIM_DEVICES", "0")
    with pytest.raises(ConfigError, match="FL_SIM_DEVICES='0' is not valid"):
        ft.auto_select_backend()
    assert_untouched()


def test_misconfigured_cpu_in_auto_selection_is_an_error(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(ConfigError, match="backend 'cpu' is misconfigured: LOCAL_WORLD_SIZE='0'"):
        ft.auto_select_backend()


@pytest.mark.full
@pytest.mark.needs_sim
def test_huge_device_count_is_bounded_in_detect():
    proc = run_python(["-m", "flagos_torchfl", "detect"], env={"FL_SIM_DEVICES": "100000000"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "misconfigured: FL_SIM_DEVICES='100000000' is not valid: give a number of devices from 1 to 128" \
        in proc.stdout


@pytest.mark.parametrize("value", ["\uff14\uff10GiB", "\u0664\u0660", "\uff15\uff10%"])
def test_unicode_digits_are_not_numbers(value):
    with pytest.raises(ConfigError, match="malformed"):
        config.parse_memory_limit(value)


@pytest.mark.parametrize("value", ["0,,", ",0", "0,,1", "\u0663"])
def test_gpu_ids_text_must_be_a_clean_list(value):
    with pytest.raises(ConfigError, match="gpu_ids="):
        config.parse_gpu_ids(value)


def test_enable_mixed_precision_empty_string_is_rejected():
    with pytest.raises(ConfigError, match="enable_mixed_precision=''"):
        ft.init_backend("cpu", enable_mixed_precision="")
    assert_untouched()


@pytest.mark.parametrize("limit, message", [
    (1e-9, "below the minimum of 1 MiB"), (10**30, "is more than device 0"), ("1e-300", "malformed"),
])
def test_limit_outside_the_device_is_rejected(limit, message):
    with pytest.raises(ConfigError, match=message):
        ft.init_backend("cpu", memory_virtual_limit=limit)
    assert_untouched()


def test_assigned_limit_above_the_device_is_rejected_while_active():
    first = ft.init_backend("cpu")
    with pytest.raises(ConfigError, match="is more than device 0"):
        ft.memory_virtual_limit = 10**30
    assert ft.current_backend() is first and ft.memory_virtual_limit is None


@pytest.mark.parametrize("backend", [5, b"cpu", {"cpu": 1}, ["cpu", 5], 1.5])
def test_backend_argument_of_the_wrong_type(backend):
    with pytest.raises(ConfigError, match="backend=.* is not valid: give a backend name"):
        ft.init_backend(backend=backend)
    assert_untouched()


@pytest.mark.parametrize("name, hint", [("gpu_ids", "init_backend\\(gpu_ids="), ("backend", "init_backend\\(backend=")])
def test_chosen_at_init_names_are_not_assignable(name, hint):
    with pytest.raises(ConfigError, match=f"ft.{name} cannot be assigned: .*{hint}"):
        setattr(ft, name, [0] if name == "gpu_ids" else "cpu")
    assert name not in vars(ft)


@pytest.mark.parametrize("spec, message", [
    (",", "names no operator"), (" , ,", "names no operator"), ("add,relu()", "not an operator name"),
])
def test_empty_or_garbage_native_ops_list(spec, message):
    from flagos_torchfl.backends import get_backend

    with pytest.raises(ConfigError, match=message):
        get_backend("sim").options({"FL_SIM_NATIVE_OPS": spec})


def test_empty_native_ops_file(tmp_path):
    from flagos_torchfl.backends import get_backend

    empty = tmp_path / "ops.txt"
    empty.write_text("# nothing here\n\n")
    with pytest.raises(ConfigError, match="names no operator"):
        get_backend("sim").options({"FL_SIM_NATIVE_OPS": str(empty)})


def test_non_utf8_and_directory_files_name_the_file(tmp_path):
    from flagos_torchfl.backends import get_backend

    latin = tmp_path / "ops.txt"
    latin.write_bytes(b"add,\xe9\xff\n")
    routes = tmp_path / "routes.json"
    routes.write_bytes(b'{"routes": {"softmax": "cpu\xff"}}')
    sim = get_backend("sim")
    with pytest.raises(ConfigError, match=f"native op file '{latin}' is not UTF-8 text"):
        sim.options({"FL_SIM_NATIVE_OPS": str(latin)})
    with pytest.raises(ConfigError, match="names a directory, not a file"):
        sim.options({"FL_SIM_NATIVE_OPS": str(tmp_path) + os.sep})
    with pytest.raises(ConfigError, match=f"routing config '{routes}' is not UTF-8 text"):
        ft.load_routing_config(routes)
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        ft.load_routing_config(tmp_path)
    with pytest.raises(ConfigError, match="routing config path None is not valid"):
        ft.load_routing_config(None)


@pytest.mark.full
def test_ops_export_to_a_missing_folder(tmp_path):
    target = tmp_path / "no" / "such" / "chip.json"
    proc = run_python(["-m", "flagos_torchfl", "ops", "--backend", "cpu", "--export", str(target)], timeout=180)
    assert proc.returncode == 1
    assert f"ops: cannot write '{target}': No such file or directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_env_report_prints_declared_and_device_variables_only_and_masks_secrets():
    shown = env_cli.environment({
        "FL_BACKEND": "cpu", "CUDA_VISIBLE_DEVICES": "0", "FL_API_TOKEN": "s3cret-token",
        "FL_SECRET_KEY": "hunter2", "FL_MY_PASSWORD": "pw", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x",
        "FL_BAKEND": "cpu", "ASCEND_RT_VISIBLE_DEVICES": "1",
    })
    text = "\n".join(shown)
    assert "FL_BACKEND=cpu" in shown and "CUDA_VISIBLE_DEVICES=0" in shown
    assert "ASCEND_RT_VISIBLE_DEVICES=1" in shown
    for secret in ("s3cret-token", "hunter2", "=pw", "/root", "FL_BAKEND=cpu"):
        assert secret not in text
    assert "AWS_SECRET_ACCESS_KEY" not in text and "HOME" not in text
    assert any(line.startswith("FL_API_TOKEN (not a flagos_torchfl variable.") and
               line.endswith("Value not shown)") for line in shown)
    assert "FL_BAKEND (not a flagos_torchfl variable. Did you mean 'FL_BACKEND'? Value not shown)" in shown


def test_env_report_prints_declared_variables_with_their_values():
    shown = env_cli.environment({"FL_ROUTING_CONFIG": "/srv/routes.json", "FL_OP_ROUTE": "softmax=cpu"})
    assert shown == ["FL_OP_ROUTE=softmax=cpu", "FL_ROUTING_CONFIG=/srv/routes.json"]
