"""The sim installed with a native set from FL_SIM_NATIVE_OPS (after a refused install while a
backend fallback held PrivateUse1)."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl.sim as fsim
from flagos_torchfl.errors import ConfigError, PrivateUse1ClaimedError

pytestmark = pytest.mark.isolated


def test_a_backend_fallback_on_privateuse1_counts_as_a_claim():
    library = torch.library.Library("_", "IMPL")
    library.fallback(lambda op, *args, **kwargs: op(*args, **kwargs), "PrivateUse1")
    try:
        with pytest.raises(PrivateUse1ClaimedError, match="fallback"):
            fsim.install()
    finally:
        library._destroy()
    assert not fsim.is_installed()


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    path = tmp_path_factory.mktemp("ops") / "native.txt"
    path.write_text("add.Tensor\nmm  # matrix product\n")
    from flagos_torchfl.backends.sim import SimBackend

    native = SimBackend().options({"FL_SIM_NATIVE_OPS": str(path)})["native_ops"]
    return fsim.install(3, native, memory_limit=32 << 20)


def test_native_set_is_the_named_ops_plus_runtime_primitives(sim):
    native = fsim.native_op_names()
    assert {"aten::add.Tensor", "aten::mm", "aten::mm.out", "aten::copy_",
            "aten::empty.memory_format", "aten::_to_copy"} <= native
    assert "aten::mul.Tensor" not in native and "aten::add.out" not in native
    assert sim.device_count() == 3
    assert sim.mem_get_info(2)[1] == 32 << 20


def test_only_native_ops_run(sim):
    a = torch.ones(2, 2, device="sim:2")
    assert (a + a).cpu().tolist() == [[2, 2], [2, 2]]
    assert (a @ a).cpu().tolist() == [[2, 2], [2, 2]]
    with pytest.raises(NotImplementedError, match="aten::mul"):
        a * a


def test_reinstall_rules(sim):
    native = fsim.native_op_names()
    assert fsim.install(3, native, memory_limit=32 << 20) is sim
    with pytest.raises(ConfigError, match="native operator set"):
        fsim.install(3, None, memory_limit=32 << 20)
    fsim.set_memory_limit(64 << 20)
    assert fsim.install(3, native, memory_limit=64 << 20) is sim
    with pytest.raises(ConfigError):
        fsim.install(3, native, memory_limit=32 << 20)
    with pytest.raises(ConfigError):
        fsim.install(3, "add")
