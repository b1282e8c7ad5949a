"""Selection: FL_BACKEND, init_backend, precedence, validation, and nothing changed on bad input."""
import logging

import pytest

import flagos_torchfl as ft
from flagos_torchfl import selection
from flagos_torchfl.backends import ProbeResult
from flagos_torchfl.backends.base import DeviceInfo
from flagos_torchfl.config import MemoryLimit
from flagos_torchfl.errors import (
    AlreadyInitializedError, BackendUnavailableError, ConfigError, UnknownBackendError,
)
from tests.helpers import run_python


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for var in ("FL_BACKEND", "FL_BACKEND_FROM_LAUNCHER", "FL_CPU_DEVICES", "LOCAL_WORLD_SIZE",
                "FL_GPU_IDS", "FL_MEMORY_VIRTUAL_LIMIT", "FL_MEMORY_POOL_CLEAR_INTERVAL",
                "FL_MIXED_PRECISION"):
        monkeypatch.delenv(var, raising=False)
    ft.deactivate()
    yield
    ft.deactivate()
    from flagos_torchfl import api

    api._assigned.clear()


def test_auto_picks_cpu_here_and_says_why():
    s = ft.auto_select_backend()
    assert (s.backend, s.device_type, s.source, s.devices) == ("cpu", "cpu", "auto", (0,))
    assert s.reason.startswith("highest-priority available backend; not available: cuda")
    assert ft.current_backend() is s


def test_fl_backend_single_unavailable_is_an_error_with_the_probe_reason(monkeypatch):
    monkeypatch.setenv("FL_BACKEND", "ascend")
    with pytest.raises(BackendUnavailableError, match="torch_npu is not installed"):
        ft.auto_select_backend()
    assert ft.current_backend() is None


def test_fl_backend_list_takes_the_first_available(monkeypatch):
    monkeypatch.setenv("FL_BACKEND", "ascend,cuda,cpu")
    s = ft.auto_select_backend()
    assert s.backend == "cpu" and s.source == "FL_BACKEND"
    assert s.reason == "first available in FL_BACKEND=ascend,cuda,cpu"


def test_fl_backend_list_with_none_available_names_each_reason(monkeypatch):
    monkeypatch.setenv("FL_BACKEND", "npu,mlu")
    with pytest.raises(BackendUnavailableError) as info:
        ft.auto_select_backend()
    assert "ascend: torch_npu is not installed" in str(info.value)
    assert "cambricon: torch_mlu is not installed" in str(info.value)


def test_fl_backend_unknown_lists_valid_names(monkeypatch):
    monkeypatch.setenv("FL_BACKEND", "ascend,cambrikon")
    with pytest.raises(UnknownBackendError, match="unknown FL_BACKEND value 'cambrikon'. Did you mean 'cambricon'"):
        ft.auto_select_backend()


def test_environment_beats_code_and_says_so(monkeypatch, capfd):
    monkeypatch.setenv("FL_BACKEND", "cpu")
    logging.getLogger("flagos_torchfl").setLevel(logging.INFO)
    try:
        s = ft.init_backend(backend="cuda")
    finally:
        logging.getLogger("flagos_torchfl").setLevel(logging.WARNING)
    assert s.backend == "cpu"
    assert "FL_BACKEND=cpu overrides init_backend(backend='cuda') in code" in capfd.readouterr().err


def test_launcher_mark_sets_the_source(monkeypatch):
    monkeypatch.setenv("FL_BACKEND", "cpu")
    monkeypatch.setenv("FL_BACKEND_FROM_LAUNCHER", "1")
    assert ft.init_backend("cuda").source == "launcher"


def test_code_request_unavailable_is_an_error_never_a_silent_fallback():
    with pytest.raises(BackendUnavailableError, match="backend 'cuda' is not available: no NVIDIA driver found|torch was built without CUDA"):
        ft.init_backend(backend="cuda")
    assert ft.current_backend() is None


def test_same_settings_again_is_a_no_op_and_different_ones_an_error():
    first = ft.init_backend("cpu", memory_virtual_limit="2GiB")
    assert ft.init_backend("cpu", memory_virtual_limit="2GiB") is first
    with pytest.raises(AlreadyInitializedError, match="call ft.deactivate"):
        ft.init_backend("cpu", memory_virtual_limit="3GiB")
    assert ft.current_backend() is first
    ft.deactivate()
    assert ft.current_backend() is None


def test_logical_devices_map_to_gpu_ids(monkeypatch):
    monkeypatch.setenv("FL_CPU_DEVICES", "4")
    s = ft.init_backend("cpu", gpu_ids=[2, 3])
    assert s.devices == (2, 3)


@pytest.mark.parametrize("kwargs, message", [
    ({"gpu_ids": []}, "gpu_ids is empty"),
    ({"gpu_ids": [0, 0]}, "more than once"),
    ({"gpu_ids": ["0"]}, "must hold integers"),
    ({"gpu_ids": [1]}, r"out of range; the backend has 1 device\(s\)"),
    ({"memory_virtual_limit": "lots"}, "malformed"),
    ({"memory_virtual_limit": 12}, "below the minimum of 1 MiB"),
    ({"memory_pool_clear_interval": 0}, "positive int"),
])
def test_bad_input_raises_and_changes_nothing(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ft.init_backend("cpu", **kwargs)
    assert ft.current_backend() is None


def test_bad_input_while_active_keeps_the_active_selection():
    active = ft.init_backend("cpu")
    with pytest.raises(ConfigError):
        ft.init_backend("cpu", gpu_ids=[5])
    assert ft.current_backend() is active


def test_settings_arrive_from_the_environment(monkeypatch):
    monkeypatch.setenv("FL_MEMORY_VIRTUAL_LIMIT", "0.5")
    monkeypatch.setenv("FL_MEMORY_POOL_CLEAR_INTERVAL", "25")
    monkeypatch.setenv("FL_MIXED_PRECISION", "yes")
    s = ft.init_backend("cpu", memory_pool_clear_interval=10)
    assert s.settings.memory_virtual_limit == MemoryLimit(fraction=0.5)
    assert s.settings.memory_pool_clear_interval == 25  # the environment wins
    assert s.settings.enable_mixed_precision is True
    assert s.memory_limit_bytes(0) == s.probe.devices[0].total_memory // 2


def test_bad_environment_setting_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("FL_MEMORY_POOL_CLEAR_INTERVAL", "often")
    with pytest.raises(ConfigError, match="memory_pool_clear_interval='often'"):
        ft.init_backend("cpu")


def test_assignment_is_validated_in_the_same_place():
    ft.init_backend("cpu")
    ft.memory_pool_clear_interval = 50
    assert ft.memory_pool_clear_interval == 50
    assert ft.current_backend().settings.memory_pool_clear_interval == 50
    with pytest.raises(ConfigError, match="positive int"):
        ft.memory_pool_clear_interval = -1
    assert ft.memory_pool_clear_interval == 50
    ft.memory_virtual_limit = "1GiB"
    assert ft.current_backend().memory_limit_bytes() == 1 << 30
    with pytest.raises(ConfigError, match="malformed"):
        ft.memory_virtual_limit = "1 zillion"
    ft.enable_mixed_precision = "on"
    assert ft.enable_mixed_precision is True


def test_assignment_before_init_applies_to_the_next_selection():
    ft.memory_pool_clear_interval = 7
    assert ft.init_backend("cpu").settings.memory_pool_clear_interval == 7


def test_sim_is_never_auto_selected_but_can_be_requested_without_probing():
    def probe(name):
        # every accelerator unavailable; sim answers on request
        return ProbeResult(name, "on-request" if name == "sim" else "unavailable", reason="absent",
                           devices=[DeviceInfo(0, "x")] if name == "sim" else [])

    with pytest.raises(BackendUnavailableError):
        selection.choose(None, {}, probe)  # sim is not auto-selectable, cpu "absent" here
    assert selection.choose("sim", {}, probe)[0] == "sim"


@pytest.mark.full
def test_command_line_examples():
    proc = run_python(["-c", "import flagos_torchfl as ft; ft.auto_select_backend()"],
                      env={"FL_BACKEND": "ascend"})
    assert proc.returncode != 0 and "torch_npu" in proc.stderr
    proc = run_python(["-c", "import flagos_torchfl as ft; ft.auto_select_backend()"],
                      env={"FL_BACKEND": "bogus"})
    assert proc.returncode != 0
    assert "Valid names: " in proc.stderr and "ascend" in proc.stderr and "mthreads" in proc.stderr
    proc = run_python(["-c", "import flagos_torchfl as ft; print(ft.auto_select_backend().backend)"],
                      env={"FL_BACKEND": "ascend,cpu"})
    assert proc.stdout.strip() == "cpu", proc.stderr


def test_environment_wins_over_an_assignment_while_active(monkeypatch):
    monkeypatch.setenv("FL_MEMORY_POOL_CLEAR_INTERVAL", "10")
    active = ft.init_backend("cpu")
    ft.memory_pool_clear_interval = 50
    assert ft.current_backend() is active and ft.memory_pool_clear_interval == 10
    assert ft.init_backend("cpu") is active  # still the same request: a no-op


def test_assignment_while_active_reactivates_with_the_new_value(capfd):
    first = ft.init_backend("cpu")
    ft.memory_pool_clear_interval = 12
    now = ft.current_backend()
    assert now is not first and now.settings.memory_pool_clear_interval == 12
    assert now.backend == first.backend and now.devices == first.devices
    assert "not applied" not in capfd.readouterr().err


def fail_on_13(selection):
    """An activation step that cannot serve one setting value (injected by the test below)."""
    if selection.settings.memory_pool_clear_interval == 13:
        raise RuntimeError("step refuses interval 13")
    return None


def test_failed_reactivation_restores_the_previous_selection(monkeypatch):
    from flagos_torchfl import api

    monkeypatch.setattr(api, "ACTIVATION_STEPS",
                        api.ACTIVATION_STEPS + (("test", fail_on_13),))
    first = ft.init_backend("cpu", memory_pool_clear_interval=4)
    with pytest.raises(RuntimeError, match="refuses interval 13"):
        ft.memory_pool_clear_interval = 13
    assert ft.current_backend() is first
    import torch

    assert torch.cuda.is_available()  # still redirected
    assert torch.zeros(1, device="cuda").device.type == "cpu"


def test_failing_undo_is_reported_after_undoing_the_rest(monkeypatch):
    from flagos_torchfl import api

    ft.init_backend("cpu")
    undone = []
    api._undo.insert(0, ("first", lambda: undone.append("first")))
    api._undo.append(("broken", lambda: (_ for _ in ()).throw(OSError("stuck"))))
    with pytest.raises(ft.ActivationError, match="broken: stuck"):
        ft.deactivate()
    assert undone == ["first"] and ft.current_backend() is None
    import torch

    assert not torch.cuda.is_available()  # the redirect's own undo ran too


def test_mixed_precision_can_be_turned_off_again_in_code():
    ft.enable_mixed_precision = True
    assert ft.init_backend("cpu", enable_mixed_precision=False).settings.enable_mixed_precision is False


def test_misspelt_setting_assignment_is_an_error():
    with pytest.raises(ConfigError, match="Did you mean 'memory_virtual_limit'"):
        ft.memory_virtual_limt = "1GiB"
    assert not hasattr(ft, "memory_virtual_limt")
