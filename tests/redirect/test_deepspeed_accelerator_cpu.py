"""DeepSpeed's accelerator on the cpu backend (a module of its own process: DeepSpeed keeps its
choice for the process): with DeepSpeed imported before activation, activation installs the
package's accelerator, answering for the backend's logical devices; deactivation puts back the
CPU accelerator DeepSpeed had chosen; ``DS_ACCELERATOR`` is left to DeepSpeed."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl as ft
from tests.e2e.realclients import requires

pytestmark = [pytest.mark.isolated, requires("deepspeed")]


def test_imported_before_activation(two_cpu_devices_after_deepspeed):
    accelerator, before = two_cpu_devices_after_deepspeed
    assert type(accelerator).__name__ == "BackendAccelerator"
    assert accelerator.device_name() == "cpu" and accelerator.device_name(1) == "cpu"
    assert accelerator.device_count() == torch.cuda.device_count() == 2
    accelerator.set_device(1)
    assert accelerator.current_device() == 1 and torch.cuda.current_device() == 1
    accelerator.set_device(0)
    assert accelerator.communication_backend_name() == "gloo"
    assert accelerator.FloatTensor([1.0]).device.type == "cpu"
    assert not accelerator.pin_memory(torch.ones(2)).is_pinned()  # no device to pin for
    assert accelerator.memory_allocated() == torch.cuda.memory_allocated() > 0
    assert accelerator.is_bf16_supported() == before.is_bf16_supported()
    assert accelerator.supported_dtypes() == before.supported_dtypes()
    start, end = accelerator.Event(enable_timing=True), accelerator.Event(enable_timing=True)
    start.record()
    end.record()
    assert start.elapsed_time(end) >= 0
    accelerator.manual_seed(3)
    first = torch.rand(2)
    accelerator.manual_seed(3)
    assert torch.equal(first, torch.rand(2))


def test_deactivate_restores_deepspeeds_choice(two_cpu_devices_after_deepspeed):
    import deepspeed.accelerator.real_accelerator as real

    _, before = two_cpu_devices_after_deepspeed
    ft.deactivate()
    assert real.get_accelerator() is before


def test_ds_accelerator_is_left_to_deepspeed(monkeypatch):
    import deepspeed.accelerator.real_accelerator as real

    ft.deactivate()
    before = real.get_accelerator()
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    ft.init_backend("cpu")
    assert real.get_accelerator() is before
    ft.deactivate()


@pytest.fixture
def two_cpu_devices_after_deepspeed(monkeypatch):
    from deepspeed.accelerator import get_accelerator

    before = get_accelerator()  # DeepSpeed's own choice (its CPU accelerator here)
    monkeypatch.setenv("FL_CPU_DEVICES", "2")
    ft.deactivate()
    ft.init_backend("cpu")
    yield get_accelerator(), before
    ft.deactivate()
