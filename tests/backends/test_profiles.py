"""Sim profiles as decisions (nothing installed): each profile loads, takes its native set from
the chip's table and every trait from the chip's own Backend, and its inputs are validated."""
from __future__ import annotations

import json

import pytest
import torch

from flagos_torchfl.aten import dispatcher
from flagos_torchfl.backends import get_backend
from flagos_torchfl.tables import chip_models, op_tables
from flagos_torchfl.backends import registry
from flagos_torchfl.backends.profile import ProfileBackend
from flagos_torchfl.tables.profile_specs import known_table_ops, native_set, profiles
from flagos_torchfl.errors import ConfigError
from flagos_torchfl.routing import budget, plan
from flagos_torchfl.routing.gaps import resolve_gaps
from flagos_torchfl.selection import build_selection
from flagos_torchfl.sim.operators.native_ops import runtime_primitive_names
from tests.helpers import run_python

CHIPS = ["ascend", "cambricon", "mthreads"]
MASKS = ["ASCEND_RT_VISIBLE_DEVICES", "MLU_VISIBLE_DEVICES", "MUSA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]


@pytest.fixture
def env(monkeypatch):
    for name in ["FL_BACKEND", "FL_SIM_PROFILE", "FL_SIM_NATIVE_OPS", "FL_SIM_DEVICES", "FL_SIM_DEVICE_MEMORY",
                 "FL_MEMORY_VIRTUAL_LIMIT", "LOCAL_WORLD_SIZE", *MASKS]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_model_brings_its_traits_and_the_chip_alone_is_its_default_model():
    default, old = registry().profile("ascend"), registry().profile("ascend:910a")
    assert default.model is chip_models.default_model("ascend") and default.model.name == "910b"
    assert registry().profile("ascend:910b").model == default.model
    assert (old.model.device_name, old.model.memory, old.model.bfloat16) == ("Ascend910A", 32 << 30, False)
    assert old.probe().devices[0].name == "Ascend910A (flagos sim)" and old.probe().devices[0].total_memory == 32 << 30
    assert old.supports_bfloat16() is False and default.supports_bfloat16() is True
    assert old.chip is default.chip and native_set("ascend:910a") == native_set("ascend")  # one table per chip
    assert old.cuda_capability(old.supports_bfloat16()) == (7, 0)
    assert default.cuda_capability(default.supports_bfloat16()) == (8, 0)
    for chip, found in chip_models.all_models().items():
        assert chip in CHIPS and found[0] is chip_models.default_model(chip)
        for model in found:
            assert set(model.sources) == {"device_name", "memory_gib", "bfloat16", "tf32"}, model.spec


@pytest.mark.parametrize("spec, message", [
    ("ascend:91a", r"FL_SIM_PROFILE: '91a' is not a model of ascend\. Did you mean '910a'\? Valid: ascend:910a, ascend:910b"),
    ("ascned:910a", r"FL_SIM_PROFILE 'ascned:910a' is not a sim profile\. Did you mean 'ascend'\?"),
    ("cambricon:mlu590", r"'mlu590' is not a model of cambricon\. .*Valid: cambricon:mlu370-x8"),
])
def test_an_unknown_model_names_the_closest_and_the_valid_ones(env, spec, message):
    env.setenv("FL_SIM_PROFILE", spec)
    with pytest.raises(ConfigError, match=message):
        build_selection("sim", {})


def test_a_model_selected_in_the_environment_is_the_selection_s_chip(env):
    env.setenv("FL_SIM_PROFILE", "ascend:910a")
    selection = build_selection("sim", {})
    assert selection.chip is registry().profile("ascend:910a") and selection.chip.model.name == "910a"
    assert selection.probe.devices[0].name == "Ascend910A (flagos sim)"
    assert selection.options["native_ops"] == native_set("ascend")


@pytest.mark.parametrize("name", CHIPS)
def test_each_profile_loads_with_the_chips_own_answers(name):
    chip, profile = get_backend(name), registry().profile(name)
    assert isinstance(profile, ProfileBackend) and profile.chip is chip
    for trait in ("device_type", "collective", "low_precision_dtype", "supports_float64",
                  "visible_devices_env", "kernel_libraries"):
        assert getattr(profile, trait) == getattr(chip, trait), trait
    assert profile.rename_problem is None  # no other PrivateUse1 backend in this process
    native = native_set(name)
    known, missing = known_table_ops(name)
    assert native - runtime_primitive_names() <= known
    if torch.__version__.split("+")[0] == op_tables.load(name).torch_checked:
        assert not missing  # the release the table was checked against knows every name
    else:  # another release may lack some (torch 2.14 removed aten::cholesky): not native then
        assert not native & set(missing)
    assert len(native) > 700
    assert profile.probe().devices[0].total_memory == profile.model.memory == chip_models.default_model(name).memory


def test_chips_without_float64_get_a_float64_gap_on_compute_but_not_on_copies():
    assert [get_backend(c).supports_float64 for c in CHIPS] == [False, False, False]
    profile = registry().profile("ascend")
    native = native_set("ascend")
    gaps = resolve_gaps(profile.dtype_gaps, native)
    assert "aten::mm" in gaps and "aten::addmm" in gaps
    assert not set(gaps) & {"aten::copy_", "aten::_to_copy", "aten::empty.memory_format", "aten::_local_scalar_dense"}


def test_out_only_entries_serve_the_functional_through_pytorchs_structured_kernel():
    # the Ascend table lists only gelu.out; PyTorch serves gelu and gelu_ on every backend
    # through it, so the functional never reaches the chip and is native in effect
    native = native_set("ascend")
    assert "aten::gelu.out" in native and "aten::gelu" not in native
    assert not dispatcher.needs_backend_kernel("aten::gelu")
    assert dispatcher.out_delegate("aten::gelu") == "aten::gelu.out"
    assert dispatcher.out_delegate("aten::scatter_.src") == "aten::scatter.src_out"
    assert dispatcher.out_delegate("aten::relu") is None
    routes = {r["op"]: r["route"] for r in plan.plan(registry().profile("ascend"), native)}
    assert routes["aten::gelu.out"] == "native" and "aten::gelu" not in routes


def test_selection_takes_the_profile_and_the_chips_visible_devices_variable(env):
    env.setenv("FL_SIM_PROFILE", "ascend")
    env.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # copied to ASCEND_RT_VISIBLE_DEVICES, as on the chip
    selection = build_selection("sim", {})
    assert selection.chip is registry().profile("ascend") and selection.backend == "sim"
    assert (selection.device_type, selection.collective, selection.low_precision_dtype) == ("npu", "hccl", "float16")
    assert selection.devices == (0, 1)
    assert selection.probe.devices[0].name == "Ascend910B1 (flagos sim)"
    assert selection.options["native_ops"] == native_set("ascend")
    import os

    assert "ASCEND_RT_VISIBLE_DEVICES" not in os.environ  # copied for the probe only, then undone


def test_memory_per_device_defaults_to_the_chips_and_is_overridable(env):
    env.setenv("FL_SIM_PROFILE", "mthreads")
    env.setenv("FL_SIM_DEVICES", "3")
    selection = build_selection("sim", {})
    assert selection.devices == (0, 1, 2)
    assert selection.device_memory(0) == 48 << 30
    assert selection.chip.device_memory(selection.options) == 48 << 30
    env.setenv("FL_SIM_DEVICE_MEMORY", "8GiB")
    env.setenv("FL_MEMORY_VIRTUAL_LIMIT", "50%")
    selection = build_selection("sim", {})
    assert selection.device_memory(0) == 8 << 30 and selection.memory_limit_bytes() == 4 << 30


def test_the_plain_sim_takes_its_memory_per_device_from_the_environment_too(env):
    env.setenv("FL_SIM_DEVICE_MEMORY", "8GiB")
    selection = build_selection("sim", {})
    assert selection.chip is get_backend("sim") and selection.device_memory(0) == 8 << 30
    assert selection.chip.device_memory(selection.options) == 8 << 30
    env.delenv("FL_SIM_DEVICE_MEMORY")
    selection = build_selection("sim", {})
    assert selection.device_memory(0) == 16 << 30 and selection.chip.device_memory(selection.options) is None


def test_same_request_tells_profiles_apart(env):
    env.setenv("FL_SIM_PROFILE", "ascend")
    a = build_selection("sim", {})
    env.setenv("FL_SIM_PROFILE", "cambricon")
    b = build_selection("sim", {})
    assert not a.same_request(b)


@pytest.mark.parametrize("variables, message", [
    ({"FL_SIM_PROFILE": "ascnd"}, "Did you mean 'ascend'"),
    ({"FL_SIM_PROFILE": "ascend", "FL_SIM_NATIVE_OPS": "mm"}, "both set"),
    ({"FL_SIM_PROFILE": "ascend", "ASCEND_RT_VISIBLE_DEVICES": "0,0"}, "distinct device numbers"),
    ({"FL_SIM_PROFILE": "ascend", "FL_SIM_DEVICES": "2", "ASCEND_RT_VISIBLE_DEVICES": "1,2"}, "below 2"),
    ({"FL_SIM_PROFILE": "ascend", "ASCEND_RT_VISIBLE_DEVICES": ""}, "0 devices visible"),
    ({"FL_SIM_DEVICE_MEMORY": "12"}, "at least 1 MiB"),
])
def test_bad_profile_input_is_refused_naming_the_problem(env, variables, message):
    for name, value in variables.items():
        env.setenv(name, value)
    with pytest.raises(Exception) as caught:
        build_selection("sim", {})
    assert message in str(caught.value)


@pytest.mark.parametrize("text, expected", [
    ("10", budget.Budget("10", calls=10)),
    ("5%", budget.Budget("5%", share=0.05)),
    ("0.5%:strict", budget.Budget("0.5%:strict", share=0.005, strict=True)),
    ("3:strict", budget.Budget("3:strict", calls=3, strict=True)),
    ("strict", budget.Budget("strict", calls=0, strict=True)),
])
def test_budget_forms(text, expected):
    assert budget.parse(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "5%%", "120%", "ten", "5:lenient"])
def test_bad_budgets_are_refused_naming_the_forms(text):
    with pytest.raises(ConfigError, match="a count"):
        budget.parse(text)


@pytest.mark.full
def test_ops_diff_compares_two_tables_by_category():
    done = run_python(["-m", "flagos_torchfl", "ops", "--profile", "ascend", "--diff", "mthreads", "--json"],
                      timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["from"]["name"].startswith("ascend (torch-npu 2.14.0)")
    lost = {op for ops in result["operators_lost"].values() for op in ops}
    # dense tables: mthreads has to_padded_tensor for nested tensors only
    ascend, mthreads = op_tables.load("ascend").dense_ops, op_tables.load("mthreads").dense_ops
    assert lost and lost <= ascend - mthreads
    assert "aten::to_padded_tensor" in lost and "aten::to_padded_tensor" in op_tables.load("mthreads").ops
    assert "aten::_slow_conv2d_forward" in result["operators_lost"]["convolution"]
    text = run_python(["-m", "flagos_torchfl", "ops", "--profile", "cambricon", "--diff", "cpu"], timeout=300)
    assert text.returncode == 0 and "moving from cambricon to cpu" in text.stdout


@pytest.mark.full
def test_ops_diff_with_a_backend_this_torch_has_no_kernels_for_says_so():
    import torch

    if dispatcher.has_kernel("aten::add.Tensor", "CUDA"):
        pytest.skip("this torch build has CUDA kernels")
    done = run_python(["-m", "flagos_torchfl", "ops", "--profile", "ascend", "--diff", "cuda"], timeout=300)
    assert done.returncode == 1
    assert f"this torch build ({torch.__version__}) registers no CUDA kernels" in done.stdout


@pytest.mark.full
def test_run_profile_usage_errors():
    done = run_python(["-m", "flagos_torchfl", "run", "--profile", "ascnd", "examples/train_cuda.py"])
    assert done.returncode == 2 and "--profile 'ascnd' is not a sim profile" in done.stderr
    assert "Valid: ascend, cambricon, mthreads" in done.stderr
    done = run_python(["-m", "flagos_torchfl", "run", "--backend", "cpu", "--profile", "ascend",
                       "examples/train_cuda.py"])
    assert done.returncode == 2 and "cannot be combined with --backend cpu" in done.stderr


@pytest.mark.full
def test_detect_lists_the_profiles():
    done = run_python(["-m", "flagos_torchfl", "detect", "--json"], timeout=300)
    rows = {r["profile"]: r for r in json.loads(done.stdout)["sim_profiles"]}
    assert sorted(rows) == profiles() == CHIPS
    assert rows["ascend"]["device_type"] == "npu" and rows["ascend"]["rename_problem"] is None
    assert rows["cambricon"]["float64"] == "routed" and rows["mthreads"]["collective"] == "mccl"
