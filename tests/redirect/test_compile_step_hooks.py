"""Optimizer step hooks survive ``torch.compile`` under activation, on every torch: torch 2.1's
dynamo takes the step-hook wrapper off every ``torch.optim`` optimizer at its first compile
(compat ``dynamo_unhooks_optimizer_steps``), which silently stopped the cpu backend's memory
limit and the program's own global step hooks. Each case runs in a fresh interpreter: dynamo
does this once per process."""
from __future__ import annotations

import pytest

from tests.helpers import run_python

SCRIPT = r'''
import sys, torch
import flagos_torchfl as ft
from torch.optim.optimizer import register_optimizer_step_post_hook
from flagos_torchfl import compat
from flagos_torchfl.machine.host import process_memory

order = sys.argv[1]
seen = []
register_optimizer_step_post_hook(lambda *a: seen.append(1))
compiled = torch.compile(lambda x: x * 2)
if order == "compile-first":
    compiled(torch.ones(2))
limit = process_memory()[0] + (96 << 20)
ft.init_backend("cpu", memory_virtual_limit=limit)
if order == "activate-first":
    compiled(torch.ones(2))
model = torch.nn.Linear(2, 1).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(1, 2, device="cuda")).sum().backward()
opt.step()
hog = torch.ones((256 << 20) // 4)
try:
    opt.step()
    print("limit not checked")
except compat.out_of_memory_error() as exc:
    print("limit checked:", "exceeds memory_virtual_limit" in str(exc))
print("program hook ran", len(seen))
del hog
ft.deactivate()
print("undone", torch.optim.SGD.step is vars(torch.optim.SGD)["step"] and getattr(
    torch.optim.SGD.step, "__wrapped__", None) is not None)
'''


@pytest.mark.parametrize("order", ["compile-first", "activate-first"])
def test_step_hooks_run_after_torch_compile(order):
    proc = run_python(["-c", SCRIPT, order], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "limit checked: True" in lines, proc.stdout + proc.stderr[-2000:]
    assert "program hook ran 2" in lines, proc.stdout
