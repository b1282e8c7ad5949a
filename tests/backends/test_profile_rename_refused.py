"""When PyTorch's PrivateUse1 slot cannot take the chip's device type name (here: something else
already owns ``torch.npu``), the profile keeps the device type ``sim``, keeps every other answer
of the chip, and says so in ``detect`` and at activation."""
from __future__ import annotations

import os
import types

import pytest
import torch

pytestmark = pytest.mark.isolated


@pytest.fixture(scope="module")
def taken():
    torch.npu = types.ModuleType("another_npu_runtime")
    for name in list(os.environ):
        if name.startswith("FL_") or name in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"):
            del os.environ[name]
    os.environ["FL_SIM_PROFILE"] = "ascend"
    yield


def test_the_profile_says_why_the_device_stays_sim(taken):
    from flagos_torchfl.backends import registry
    from flagos_torchfl.cli import detect

    profile = registry().profile("ascend")
    assert profile.rename_problem == "torch.npu already exists (another_npu_runtime)"
    assert profile.device_type == "sim" and profile.collective == "hccl"
    row = {r["profile"]: r for r in detect.sim_profiles()}["ascend"]
    assert row["device_type"] == "sim" and row["rename_problem"] == profile.rename_problem
    text = "\n".join(detect._render_profiles(detect.sim_profiles()))
    assert "ascend: the device stays 'sim': torch.npu already exists" in text
    assert any("device type stays 'sim'" in note for note in profile.probe().notes)


def test_activation_warns_and_runs_on_sim_with_the_chips_answers(taken, capfd):
    import flagos_torchfl as ft
    from flagos_torchfl import routing

    selection = ft.init_backend("sim")
    try:
        assert "WARNING sim profile ascend: the device type stays 'sim' instead of 'npu'" in capfd.readouterr().err
        x = torch.randn(3, 3, dtype=torch.float64).cuda()
        assert x.device.type == "sim" and selection.low_precision_dtype == "float16"
        assert torch.equal((x @ x).cpu(), x.cpu() @ x.cpu())
        assert [o["route"] for o in routing.current_verdict()["operators"] if o["op"] == "aten::mm"] == ["fallback"]
    finally:
        ft.deactivate()
