"""Device-argument translation: exact CUDA designations only, logical -> physical indices."""
from __future__ import annotations

import types

import pytest
import torch

from flagos_torchfl.redirect import DeviceOrdinalError, Target
from flagos_torchfl.backends import get_backend
from tests.helpers import chip


def remapping_target():
    # an accelerator-like target whose logical cuda:0, cuda:1 are physical 3 and 1
    return Target(chip("fakechip", "meta", "float16", "hccl"), (3, 1), types.SimpleNamespace())


def test_exact_strings_are_translated_and_nothing_else():
    t = remapping_target()
    assert t.translate("cuda:0") == torch.device("meta", 3)
    assert t.translate("cuda:1") == torch.device("meta", 1)
    for untouched in ("runs/cuda_ckpt.pt", "cuda_0", "cuda:", "cuda:x", "cuda:1 ", "CUDA", "cpu", "nccl", "cuda:٣"):
        assert t.translate(untouched) is untouched


def test_devices_and_ints():
    t = remapping_target()
    assert t.translate(torch.device("cuda", 1)) == torch.device("meta", 1)
    assert t.translate(0) == torch.device("meta", 3)
    cpu = torch.device("cpu")
    assert t.translate(cpu) is cpu
    assert t.translate(True) is True  # a bool is never a device
    assert t.translate_named(1) == 1  # where ints are not devices
    assert t.translate_type("cuda") == "meta" and t.translate_type("cpu") == "cpu"


def test_unindexed_cuda_means_the_current_device():
    t = remapping_target()
    t.current = 1
    assert t.translate("cuda") == torch.device("meta", 1)
    assert t.translate(torch.device("cuda")) == torch.device("meta", 1)
    assert t.logical_index(None) == 1 and t.logical_index("cuda:0") == 0
    assert t.logical_index(torch.device("meta", 3)) == 0


def test_cpu_target_has_no_indices():
    t = Target(get_backend("cpu"), (0, 1))
    assert t.translate("cuda:1") == torch.device("cpu")
    assert t.translate("cuda") == torch.device("cpu")
    assert not t.remaps and not t.cuda_itself


@pytest.mark.parametrize("bad", ["cuda:2", torch.device("cuda", 5), 7, -1])
def test_out_of_range_names_count_and_backend(bad):
    t = remapping_target()
    with pytest.raises(DeviceOrdinalError) as info:
        t.translate(bad)
    message = str(info.value)
    assert "fakechip" in message and "2 device(s)" in message and "cuda:0..cuda:1" in message


def test_bad_target_declarations():
    with pytest.raises(ValueError, match="no devices"):
        Target(chip("x", "meta"), (), types.SimpleNamespace())
    with pytest.raises(ValueError, match="bfloat16"):
        Target(chip("x", "meta", "int8"), (0,), types.SimpleNamespace())


def test_current_device_is_per_thread():
    import threading

    t = remapping_target()
    t.current = 1
    seen = []
    thread = threading.Thread(target=lambda: seen.append(t.current))
    thread.start()
    thread.join()
    assert seen == [0] and t.current == 1


def test_an_unindexed_own_type_is_left_to_the_chip_unless_the_backend_resolves_it():
    # mps: torch.mps has no current_device(); "mps" must pass through, untouched and unqueried
    t = Target(get_backend("mps"), (0,), torch.mps)
    assert t.translate("mps") == "mps"
    assert t.translate(torch.device("mps")) == torch.device("mps")
    # a vendor-like chip whose module would start its runtime when asked for its current device
    asked = []
    module = types.SimpleNamespace(current_device=lambda: asked.append(1) or 0)
    t = Target(chip("fakechip", "meta"), (0, 1), module)
    assert t.translate("meta") == "meta" and t.translate(torch.device("meta")) == torch.device("meta")
    assert asked == []
    # a backend that answers it resolves it through the device module's current device
    t = Target(chip("fakechip", "meta", resolves_unindexed_device=True), (0, 1), types.SimpleNamespace(current_device=lambda: 1))
    assert t.translate("meta") == torch.device("meta", 1)
    assert get_backend("sim").resolves_unindexed_device is True
