"""Fixtures of the redirection tests: an activated CPU backend, and a snapshot of torch's
namespaces to prove that deactivation restores every attribute exactly."""
from __future__ import annotations

import inspect
import types

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl import compat


def _namespaces():
    """Every module and class whose attributes the redirection could touch."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import torch.nn.parallel
    import torch.serialization
    import torch.utils._device
    import torch.utils.data

    owners = {
        "torch": torch, "torch.cuda": torch.cuda, "torch.cuda.amp": torch.cuda.amp,
        "torch.cuda.amp.autocast": torch.cuda.amp.autocast,
        "torch.cuda.amp.GradScaler": torch.cuda.amp.GradScaler,
        "torch.cuda.nvtx": torch.cuda.nvtx, "torch.cuda.memory": torch.cuda.memory,
        "torch.cuda.random": torch.cuda.random, "torch.Tensor": torch.Tensor,
        "TensorBase": torch.Tensor.__mro__[1], "torch.nn.Module": torch.nn.Module,
        "torch.fft": torch.fft, "torch.nested": torch.nested, "torch.sparse": torch.sparse,
        "torch.distributed": dist, "c10d": c10d, "torch.nn.parallel": torch.nn.parallel,
        "DDP": torch.nn.parallel.DistributedDataParallel,
        "torch.serialization": torch.serialization, "torch.amp": torch.amp,
        "autocast": torch.amp.autocast_mode.autocast, "GradScaler": compat.grad_scaler_class(),
        "torch.backends": torch.backends, "torch.backends.cuda": torch.backends.cuda,
        "torch.backends.cudnn": torch.backends.cudnn, "torch.cpu": torch.cpu,
        "DataLoader": torch.utils.data.DataLoader,
        "DeviceContext": torch.utils._device.DeviceContext, "torch.random": torch.random,
    }
    if compat.has("accelerator"):
        owners["torch.accelerator"] = torch.accelerator
    for name, layer in vars(torch.nn).items():
        if inspect.isclass(layer) and issubclass(layer, torch.nn.Module):
            owners[f"torch.nn.{name}"] = layer
    return owners


def snapshot() -> dict:
    """(namespace, attribute) -> id of the value, plus each module's class and the
    distributed backend table."""
    import torch.distributed.distributed_c10d as c10d

    state = {}
    for label, owner in _namespaces().items():
        state[(label, "<class>")] = id(type(owner))
        for attr, value in list(vars(owner).items()):
            state[(label, attr)] = id(value)
    for key, value in c10d.Backend.default_device_backend_map.items():
        state[("default_device_backend_map", key)] = value
    return state


def difference(before: dict, after: dict) -> list:
    return sorted(str(k) for k in set(before) | set(after) if before.get(k) != after.get(k))


@pytest.fixture
def cpu_backend(monkeypatch):
    """The CPU backend activated through the public API; deactivated afterwards."""
    for var in ("FL_BACKEND", "FL_GPU_IDS", "FL_CPU_DEVICES", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    ft.deactivate()
    selection = ft.init_backend("cpu")
    yield selection
    ft.deactivate()


@pytest.fixture
def two_cpu_devices(monkeypatch):
    """The CPU backend presenting two logical devices."""
    for var in ("FL_BACKEND", "FL_GPU_IDS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FL_CPU_DEVICES", "2")
    ft.deactivate()
    selection = ft.init_backend("cpu")
    yield selection
    ft.deactivate()


@pytest.fixture
def torch_state():
    """``snapshot()`` and ``difference(before, after)``, for tests that compare torch states."""
    return types.SimpleNamespace(snapshot=snapshot, difference=difference)


@pytest.fixture
def sim_backend(monkeypatch):
    """The sim activated through the public API (for isolated modules: it claims PrivateUse1);
    deactivated afterwards."""
    monkeypatch.setenv("FL_BACKEND", "sim")
    ft.deactivate()
    selection = ft.auto_select_backend()
    yield selection
    ft.deactivate()
