"""Registrations kept at exit: the package's dispatcher registrations stay in place while the
interpreter ends (no exit-time work to take them out), while a library it did not keep is taken
out as torch does; the process still exits cleanly."""
from __future__ import annotations

import json

import pytest

from tests.helpers import run_python

pytestmark = pytest.mark.full

#: an exit handler registered before ``import torch`` runs after every later one, torch's
#: library finalizers included: it sees what exit left registered
CHECK_AT_EXIT = r'''
import atexit, json, os, sys

def report():
    import torch

    def has(name, key):
        try:
            return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
        except RuntimeError:  # the operator itself is gone
            return False
    fallback = torch._C._dispatch_has_backend_fallback
    os.write(1, json.dumps({
        "kept_kernel": has("fl_exit::kept", "CPU"),
        "dropped_kernel": has("fl_exit::dropped", "CPU"),
        "sparse_fallback": fallback(torch._C.DispatchKey.SparsePrivateUse1),
        "sim_python_kernel": has("aten::bernoulli_.float", "PrivateUse1"),
        "autocast_rule": has("aten::mm", "AutocastPrivateUse1"),
    }).encode())

atexit.register(report)
import torch
import flagos_torchfl as ft
from flagos_torchfl.registrations import keep_at_exit

definitions = torch.library.Library("fl_exit", "DEF")
definitions.define("kept(Tensor x) -> Tensor")
definitions.define("dropped(Tensor x) -> Tensor")
kept = keep_at_exit(torch.library.Library("fl_exit", "IMPL"))
kept.impl("kept", lambda x: x + 1, "CPU")
dropped = torch.library.Library("fl_exit", "IMPL")
dropped.impl("dropped", lambda x: x + 2, "CPU")
keep_at_exit(definitions)
ft.init_backend(backend="sim")
assert torch.ops.fl_exit.kept(torch.zeros(1)).item() == 1
'''


def test_the_package_registrations_outlive_exit_handlers_and_others_do_not():
    proc = run_python(["-c", CHECK_AT_EXIT], env={"FL_SIM_RUNTIME": "cpp"})
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found == {"kept_kernel": True, "dropped_kernel": False, "sparse_fallback": True,
                     "sim_python_kernel": True, "autocast_rule": True}
