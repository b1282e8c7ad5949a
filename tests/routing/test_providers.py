"""Kernel-provider plumbing that needs no device: registration, entry validation, and the
FlagGems adapter reading FlagGems' registration table."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flagos_torchfl.backends import get_backend
from flagos_torchfl.errors import ConfigError
from flagos_torchfl.routing import providers

FAKE = Path(__file__).resolve().parent / "fake_flag_gems"


@pytest.fixture
def fake_gems(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE))
    yield
    sys.modules.pop("flag_gems", None)


def test_flaggems_plugs_in_on_a_chip_it_supports(fake_gems):
    ascend = get_backend("ascend")
    gems = providers.FlagGemsProvider()
    assert gems.supports(ascend)
    assert not gems.supports(get_backend("sim")) and not gems.supports(get_backend("cpu"))
    kernels = {k.op: k for k in gems.kernels(ascend)}
    # entries whose condition fails, and autograd-key registrations, are not backend kernels
    assert set(kernels) == {"aten::gelu", "aten::mm", "aten::add.Tensor"}
    table = providers.library_for(ascend)
    assert table["aten::gelu"][0][0] == "flaggems"


def test_flaggems_for_another_device_offers_nothing(fake_gems):
    assert providers.FlagGemsProvider().kernels(get_backend("cambricon")) == []


def test_without_flag_gems_nothing_plugs_in():
    assert "flag_gems" not in sys.modules
    assert not providers.FlagGemsProvider().supports(get_backend("ascend"))


def test_register_and_unregister():
    class Mine(providers.KernelProvider):
        name = "mine"

    try:
        providers.register_provider(Mine)
        assert "mine" in [p.name for p in providers.providers()]
        with pytest.raises(ConfigError, match="already registered"):
            providers.register_provider(Mine())
    finally:
        providers.unregister_provider("mine")
    assert "mine" not in [p.name for p in providers.providers()]
    with pytest.raises(ConfigError, match="is not a KernelProvider"):
        providers.register_provider(object())


def test_a_provider_that_fails_to_declare_is_left_out(capfd):
    class Broken(providers.KernelProvider):
        name = "broken"

        def supports(self, backend):
            return True

        def kernels(self, backend):
            raise RuntimeError("no device")

    providers.register_provider(Broken)
    try:
        assert "aten::gelu" not in providers.library_for(get_backend("sim"))
    finally:
        providers.unregister_provider("broken")
    assert "kernel provider broken left out: RuntimeError: no device" in capfd.readouterr().err
