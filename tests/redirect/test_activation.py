"""Activation and undo: ordered patches, exact restoration, idempotence, thread safety,
refusal on top of a vendor shim, and no half-patched torch after a failure."""
from __future__ import annotations

import sys
import threading
import types

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl import patching, redirect
from flagos_torchfl.errors import ActivationError
from flagos_torchfl.redirect import Target, patches
from flagos_torchfl.backends import get_backend
from tests.helpers import chip


def test_deactivate_restores_every_attribute(cpu_backend, torch_state):
    during = torch_state.snapshot()
    ft.deactivate()
    after = torch_state.snapshot()
    ft.init_backend("cpu")
    again = torch_state.snapshot()
    ft.deactivate()
    final = torch_state.snapshot()
    assert torch_state.difference(after, final) == []
    assert torch_state.difference(during, again) != []  # activation did change torch
    assert torch.zeros.__class__.__name__ == "builtin_function_or_method"
    assert "to" not in vars(torch.Tensor) and type(torch.cuda) is types.ModuleType


def test_snapshot_before_and_after_a_full_cycle(torch_state, monkeypatch):
    monkeypatch.delenv("FL_BACKEND", raising=False)
    ft.deactivate()
    before = torch_state.snapshot()
    ft.init_backend("cpu")
    torch.zeros(2, device="cuda").cuda().to(0)
    torch.cuda.manual_seed(1)
    ft.deactivate()
    assert torch_state.difference(before, torch_state.snapshot()) == []


def test_patch_list_is_ordered_and_named(cpu_backend):
    names = [p.name for p in patches.REGISTRY]
    assert names[:3] == ["device_context", "generator", "factories"]
    assert names.index("torch_cuda") < names.index("autocast") < names.index("load_locations")
    applied, waiting = redirect.active_patches(), redirect.waiting_patches()
    assert sorted(applied + waiting, key=names.index) == names  # each patch applied or waiting
    assert applied == [n for n in names if n not in waiting]  # in registry order
    waits_for = {p.name: p.waits_for for p in patches.REGISTRY}
    assert all(waits_for[n] and waits_for[n] not in sys.modules for n in waiting)
    assert all(p.apply.__doc__ for p in patches.REGISTRY)


def test_activation_is_idempotent(cpu_backend):
    zeros = torch.zeros
    assert ft.init_backend("cpu") is cpu_backend
    undo = redirect.activate(cpu_backend)
    undo()  # the undo of a repeated activation changes nothing
    assert torch.zeros is zeros and redirect.active_patches()
    assert torch.zeros.__wrapped__ is torch._C._VariableFunctions.zeros


def test_concurrent_activation_patches_once(monkeypatch, torch_state):
    monkeypatch.delenv("FL_BACKEND", raising=False)
    ft.deactivate()
    before = torch_state.snapshot()
    barrier = threading.Barrier(8)
    results, errors = [], []

    def worker():
        barrier.wait()
        try:
            results.append(ft.init_backend("cpu"))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len({id(r) for r in results}) == 1
    assert torch.zeros.__wrapped__ is torch._C._VariableFunctions.zeros  # one layer only
    ft.deactivate()
    assert torch_state.difference(before, torch_state.snapshot()) == []


def test_other_backend_while_active_is_refused(cpu_backend):
    other = Target(chip("fakechip", "meta"), (0,), types.SimpleNamespace())
    with pytest.raises(ActivationError, match="already active for backend 'cpu'"):
        redirect.apply(other)


def test_failing_patch_leaves_nothing_half_patched(monkeypatch, torch_state):
    monkeypatch.delenv("FL_BACKEND", raising=False)
    ft.deactivate()
    before = torch_state.snapshot()

    def broken(target, patcher):
        patcher.setattr(torch, "ones", lambda *a, **k: None)
        raise RuntimeError("injected fault")

    fault = patches.Patch("injected", broken, False)
    position = [p.name for p in patches.REGISTRY].index("autocast")
    monkeypatch.setattr(patches, "REGISTRY", patches.REGISTRY[:position] + [fault] + patches.REGISTRY[position:])
    monkeypatch.setattr(redirect, "REGISTRY", patches.REGISTRY)
    with pytest.raises(ActivationError, match="'injected' failed .*injected fault.*nothing was changed"):
        ft.init_backend("cpu")
    assert ft.current_backend() is None
    assert torch_state.difference(before, torch_state.snapshot()) == []
    assert redirect.active_patches() == []


def test_fake_vendor_shim_is_refused(monkeypatch, torch_state):
    """A fake torch_npu transfer_to_npu that wraps torch.zeros, as the real one does."""
    monkeypatch.delenv("FL_BACKEND", raising=False)
    ft.deactivate()
    shim = types.ModuleType("torch_npu.contrib.transfer_to_npu")
    exec(
        "import functools, torch\n"
        "_zeros = torch.zeros\n"
        "@functools.wraps(_zeros)\n"
        "def zeros(*args, **kwargs):\n"
        "    return _zeros(*args, **kwargs)\n",
        shim.__dict__,
    )
    monkeypatch.setattr(torch, "zeros", shim.zeros)
    before = torch_state.snapshot()
    with pytest.raises(ActivationError, match="torch_npu transfer_to_npu is active .*torch.zeros"):
        ft.init_backend("cpu")
    assert torch_state.difference(before, torch_state.snapshot()) == []
    monkeypatch.undo()  # the fake shim's wrapper is gone; now a torchada that has been imported
    monkeypatch.setitem(sys.modules, "torchada", types.ModuleType("torchada"))
    with pytest.raises(ActivationError, match="torchada is active"):
        ft.init_backend("cpu")
    assert ft.current_backend() is None


def test_cuda_backend_patches_nothing_without_renumbering():
    native = Target(get_backend("cuda"), (0, 1), torch.cuda)
    assert redirect.patches_for(native) == []
    renumbered = Target(get_backend("cuda"), (1, 0), torch.cuda)
    names = [p.name for p in redirect.patches_for(renumbered)]
    assert "torch_cuda" in names and "factories" in names
    assert not {"autocast", "grad_scaler", "pin_memory", "process_group"} & set(names)


def test_no_operator_interception(cpu_backend):
    from torch.overrides import _get_current_function_mode_stack

    assert _get_current_function_mode_stack() == []
    assert not torch._C._is_torch_function_mode_enabled()


@pytest.mark.full
def test_import_is_free():
    import subprocess

    code = (
        "import sys, torch; before = torch.zeros, torch.Tensor.to, type(torch.cuda)\n"
        "import flagos_torchfl\n"
        "assert (torch.zeros, torch.Tensor.to, type(torch.cuda)) == before\n"
        "assert 'flagos_torchfl.redirect' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_patcher_restores_exactly():
    class Base:
        def method(self):
            return "base"

    class Child(Base):
        own = 1

    module = types.ModuleType("scratch")
    table = {"kept": 1}

    class Special(types.ModuleType):
        pass

    patcher = patching.Patcher()
    patcher.setattr(Child, "method", lambda self: "patched")  # inherited: deleted again on undo
    patcher.setattr(Child, "own", 2)
    patcher.setitem(table, "kept", 5)
    patcher.setitem(table, "added", 6)
    patcher.set_module_class(module, Special)
    assert Child().method() == "patched" and Child.own == 2 and type(module) is Special
    assert len(patcher) == 5
    patcher.undo()
    assert "method" not in vars(Child) and Child().method() == "base" and Child.own == 1
    assert table == {"kept": 1} and type(module) is types.ModuleType


def test_patch_names_are_unique():
    with pytest.raises(ValueError, match="registered twice"):
        patches.patch_function("factories")(lambda target, patcher: None)
