"""The registry holds one backend per chip family; third parties join through entry points."""
import json

import pytest

from flagos_torchfl.backends import Backend, Registry, registry
from flagos_torchfl.errors import ConfigError, UnknownBackendError
from tests.helpers import install_fixture, prepend_path, run_python

EXPECTED = {
    # name: (device type, dispatch key, collective)
    "cuda": ("cuda", "CUDA", "nccl"),
    "rocm": ("cuda", "CUDA", "nccl"),
    "ascend": ("npu", "PrivateUse1", "hccl"),
    "cambricon": ("mlu", "PrivateUse1", "cncl"),
    "mthreads": ("musa", "PrivateUse1", "mccl"),
    "xpu": ("xpu", "XPU", "xccl"),
    "mps": ("mps", "MPS", "gloo"),
    "cpu": ("cpu", "CPU", "gloo"),
    "sim": ("sim", "PrivateUse1", "simccl"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_backend_declarations(name):
    b = registry().get(name)
    assert (b.device_type, b.dispatch_key, b.collective) == EXPECTED[name]
    assert b.low_precision_dtype in ("bfloat16", "float16")
    assert isinstance(b.supports_float64, bool) and isinstance(b.priority, int)


@pytest.mark.parametrize("alias, name", [
    ("npu", "ascend"), ("mlu", "cambricon"), ("musa", "mthreads"), ("hip", "rocm"),
    ("nvidia", "cuda"), ("gpu", "cuda"), ("NPU", "ascend"), (" cpu ", "cpu"),
])
def test_aliases(alias, name):
    assert registry().canonical(alias) == name


def test_priority_order_puts_accelerators_before_cpu_and_never_auto_selects_sim():
    names = [b.name for b in registry().backends()]
    assert names.index("cuda") < names.index("ascend") < names.index("cpu")
    assert not registry().get("sim").auto_selectable


def test_unknown_name_lists_valid_names_and_the_closest():
    with pytest.raises(UnknownBackendError) as info:
        registry().canonical("ascnd")
    message = str(info.value)
    assert "Did you mean 'ascend'?" in message and "cambricon" in message and "mthreads" in message


def test_register_rejects_clashing_names_and_non_backends():
    reg = Registry(load_entry_points=False)

    class Twin(Backend):
        name, device_type, aliases = "twin", "cpu", ("npu",)

    with pytest.raises(ConfigError, match="'npu' is already registered"):
        reg.register(Twin)
    assert "twin" not in reg.valid_names()
    with pytest.raises(ConfigError, match="is not a flagos_torchfl Backend"):
        reg.register(object())


@pytest.mark.full
def test_broken_entry_point_becomes_a_reason(tmp_path):
    dist = tmp_path / "broken_chip-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-chip\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[flagos_torchfl.backends]\nbroken = broken_chip_missing:Backend\n")
    env = prepend_path({}, "PYTHONPATH", tmp_path)
    proc = run_python(["-m", "flagos_torchfl", "detect", "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)["backends"]}
    assert rows["broken"]["status"] == "unavailable"
    assert "failed to load: ModuleNotFoundError" in rows["broken"]["reason"]


@pytest.fixture(scope="module")
def installed_fake_chip(tmp_path_factory):
    return install_fixture("fake_chip", tmp_path_factory)


@pytest.mark.full
def test_third_party_backend_appears_in_detect_and_is_selectable(installed_fake_chip):
    env = prepend_path({}, "PYTHONPATH", installed_fake_chip)
    proc = run_python(["-m", "flagos_torchfl", "detect", "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    rows = {r["name"]: r for r in data["backends"]}
    assert rows["fakechip"]["status"] == "available"
    assert [d["name"] for d in rows["fakechip"]["devices"]] == ["FakeChip X1", "FakeChip X1"]
    assert data["auto_select"]["backend"] == "fakechip"  # priority 5 beats cpu's 0
    code = "import flagos_torchfl as ft; s = ft.init_backend('fchip'); print(s.backend, s.devices)"
    proc = run_python(["-c", code], env=env)
    assert proc.stdout.strip() == "fakechip (0, 1)", proc.stderr
