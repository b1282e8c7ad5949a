"""Under a chip's profile, sparse and quantized tensors on the device are served or refused as the
chip's plugin registers kernels for them (``data/tensor_kinds.json``, read through the profile's
backend): each key of the device serves the plugin's overloads that the sim can run, and refuses
the others with the dispatcher's words for a missing kernel, naming the chip's device type."""
from __future__ import annotations

import json

import pytest

from flagos_torchfl import data_files, sim
from flagos_torchfl.errors import ConfigError
from flagos_torchfl.tables import profile_specs
from tests.helpers import run_python

CPU_KEYS = {"SparsePrivateUse1": "SparseCPU", "SparseCsrPrivateUse1": "SparseCsrCPU",
            "QuantizedPrivateUse1": "QuantizedCPU"}

#: in a fresh interpreter under a profile: per key, whether it has a fallback, the refusal of
#: making a tensor of that kind (None: made), the overloads registered after the first call that
#: reaches the key, and one overload with a CPU kernel left unregistered, called (None: it ran)
CHILD = r'''
import json, warnings, torch
import flagos_torchfl as ft
from flagos_torchfl.aten.dispatcher import has_backend_fallback, has_kernel, needs_backend_kernel, overload, with_kernel
warnings.simplefilter("ignore")
ft.init_backend("sim")
dt = torch._C._get_privateuse1_backend_name()
CPU = {"SparsePrivateUse1": "SparseCPU", "SparseCsrPrivateUse1": "SparseCsrCPU", "QuantizedPrivateUse1": "QuantizedCPU"}
MAKE = {
    "SparsePrivateUse1": lambda: torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]], device=dt),
                                                         torch.tensor([1.0, 2.0], device=dt), (2, 2)),
    "SparseCsrPrivateUse1": lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 2], device=dt), torch.tensor([1, 0], device=dt),
                                                            torch.tensor([1.0, 2.0], device=dt), (2, 2)),
    "QuantizedPrivateUse1": lambda: torch._empty_affine_quantized([4], scale=0.5, zero_point=0, dtype=torch.quint8, device=dt),
}
def unary(name):
    args = [a for a in torch._C._get_schema(*(name.partition(".")[::2])).arguments if not a.has_default_value()]
    return len(args) == 1 and str(args[0].type) == "Tensor" and not args[0].alias_info
out = {"device_type": dt}
for key, make in MAKE.items():
    entry = {"fallback": has_backend_fallback(key)}
    try:
        t = make()
        entry["made"] = None
    except NotImplementedError as e:
        t, entry["made"] = None, str(e).split(". ")[0]
    if t is not None:
        candidates = [n for n in sorted(with_kernel(CPU[key])) if needs_backend_kernel(n) and unary(n)]
        try:
            overload(candidates[0])(t)  # the first call reaching the key registers its kernels
        except (NotImplementedError, RuntimeError):
            pass
        refused = [n for n in candidates if not has_kernel(n, key)]
        if refused:
            try:
                overload(refused[0])(t)
                entry["refused"] = [refused[0], None]
            except NotImplementedError as e:
                entry["refused"] = [refused[0], str(e).split(". ")[0]]
    entry["registered"] = sorted(n for n in with_kernel(CPU[key]) | {"aten::_copy_from"} if has_kernel(n, key))
    out[key] = entry
print(json.dumps(out))
'''


def test_every_profile_chip_has_its_plugins_tensor_kinds_with_their_source():
    for chip in profile_specs.profiles():
        kinds = profile_specs.tensor_kinds(chip)
        assert set(kinds) == set(CPU_KEYS) == set(sim.TENSOR_KIND_KEYS)
        assert all(name.startswith("aten::") for names in kinds.values() for name in names)
        source = data_files.read_json("tensor_kinds.json")["chips"][chip]["source"]
        assert source["evidence"] and (source.get("commit") or source.get("version"))


def test_the_profile_backend_answers_its_chips_kinds():
    from flagos_torchfl.backends.registry import registry

    for chip in profile_specs.profiles():
        backend = registry().profile(chip)
        assert backend.tensor_kinds() == profile_specs.tensor_kinds(chip)


def test_unknown_keys_are_refused_naming_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown dispatch key.*'SparseCUDA'.*valid: SparsePrivateUse1"):
        sim.limit_tensor_kinds({"SparseCUDA": ["aten::add.Tensor"]})


@pytest.mark.full
@pytest.mark.needs_sim
@pytest.mark.parametrize("chip", ["ascend", "cambricon", "mthreads"])
def test_each_key_serves_and_refuses_as_the_chips_plugin(chip):
    from flagos_torchfl.aten.dispatcher import with_kernel

    proc = run_python(["-c", CHILD], env={"FL_BACKEND": "sim", "FL_SIM_PROFILE": chip, "FL_SIM_RUNTIME": "cpp"},
                      timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    device_type = found["device_type"]
    kinds = profile_specs.tensor_kinds(chip)
    for key, cpu_key in CPU_KEYS.items():
        entry, plugin = found[key], kinds[key]
        shown = key.replace("PrivateUse1", device_type)
        assert entry["fallback"] == bool(plugin), key
        servable = with_kernel(cpu_key) | ({"aten::_copy_from"} if key.startswith("Quantized") else set())
        if entry["made"] is not None:
            assert entry["made"].startswith("Could not run 'aten::") and f"from the '{shown}' backend" in entry["made"]
            assert entry["registered"] == []
            continue
        assert entry["registered"] == sorted(plugin & servable), key
        if "refused" in entry:
            name, message = entry["refused"]
            assert name not in plugin
            assert message == f"Could not run '{name}' with arguments from the '{shown}' backend"
