"""The memory and precision settings on the vendor backends (ascend, cambricon, mthreads) go
through the vendor module's API: a fake plugin per vendor (written below; it claims PrivateUse1
under the vendor's device type, has no kernels, and a device module with the vendors' memory
functions that keeps a small pool) is activated in a child interpreter with every setting on.
CUDA's allocator variables, which need no device to check, are here too."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from tests.helpers import prepend_path, run_python

PLUGIN = '''
"""A fake {module}: one device of 32 GiB under device type {device!r}, no kernels, the vendors'
memory API over a pool of 3 MiB allocated and 8 MiB reserved."""
import types

import torch

__version__ = "0.0.1"
torch.utils.rename_privateuse1_backend("{device}")
mod = types.ModuleType("{module}.{device}")
mod.pool = {{"allocated": 3 << 20, "reserved": 8 << 20, "fraction": {{}}, "synchronized": 0}}


class _Props:
    name, total_memory = "fake {device}", 32 << 30


def set_per_process_memory_fraction(fraction, device=None):
    mod.pool["fraction"][device] = fraction


def empty_cache():
    mod.pool["reserved"] = mod.pool["allocated"]


def synchronize(device=None):
    mod.pool["synchronized"] += 1


mod.set_per_process_memory_fraction, mod.empty_cache, mod.synchronize = (
    set_per_process_memory_fraction, empty_cache, synchronize)
mod.is_available = lambda: True
mod.device_count = lambda: 1
mod.current_device = lambda: 0
mod.set_device = lambda d: None
mod.manual_seed = mod.manual_seed_all = lambda s: None
mod.get_device_properties = lambda i=0: _Props()
mod.get_device_name = lambda i=0: _Props.name
mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
mod.memory_allocated = lambda d=None: mod.pool["allocated"]
mod.memory_reserved = lambda d=None: mod.pool["reserved"]
mod.max_memory_allocated = lambda d=None: 5 << 20
mod.memory_stats = lambda d=None: {{"allocation.all.current": 7}}
torch._register_device_module("{device}", mod)
'''

CHILD = '''
import json, os, warnings
import torch
import flagos_torchfl as ft
from flagos_torchfl.aten.dispatcher import autocast_casts

warnings.simplefilter("ignore")
selection = ft.init_backend(BACKEND, memory_virtual_limit="8GiB", memory_pool_clear_interval=2,
                            enable_mixed_precision=True)
pool = getattr(torch, selection.device_type).pool
out = {"fraction": dict(pool["fraction"]), "casts": autocast_casts("AutocastPrivateUse1"),
       "conf": {k: v for k, v in os.environ.items() if k.endswith("ALLOC_CONF")}}
param = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([param], lr=0.1)
reserved = []
for _ in range(4):
    pool["reserved"] = 8 << 20  # the pool caches again
    param.grad = torch.ones(2)
    opt.step()
    reserved.append(pool["reserved"] >> 20)
out["reserved_after_steps"] = reserved
pool["reserved"] = 8 << 20
out["stats"] = ft.memory_stats().as_dict()
(report,) = ft.memory_pool_defrag()
out["released"], out["synchronized"] = report.released, pool["synchronized"]
ft.deactivate()
out["fraction_after"] = dict(pool["fraction"])
out["casts_after"] = autocast_casts("AutocastPrivateUse1")
print(json.dumps(out))
'''

VENDORS = [("ascend", "torch_npu", "npu", "PYTORCH_NPU_ALLOC_CONF"),
           ("cambricon", "torch_mlu", "mlu", None),
           ("mthreads", "torch_musa", "musa", None)]


@pytest.mark.parametrize("backend,module,device,conf", VENDORS)
def test_settings_go_through_the_vendor_module(tmp_path, backend, module, device, conf):
    (tmp_path / f"{module}.py").write_text(PLUGIN.format(module=module, device=device))
    script = f"BACKEND = {backend!r}\n" + textwrap.dedent(CHILD)
    env = prepend_path({"FL_EXPANDABLE_SEGMENTS": "1"}, "PYTHONPATH", tmp_path)
    proc = run_python(["-c", script], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "accepted but not applied" not in proc.stderr
    assert out["fraction"] == {"0": 0.25}  # 8 GiB of 32 GiB
    assert out["fraction_after"] == {"0": 1.0}
    assert out["casts"] and not out["casts_after"]  # CUDA's rules while active
    assert out["reserved_after_steps"] == [8, 3, 8, 3]  # cleared at steps 2 and 4
    assert out["stats"] == {"backend": backend, "device": 0, "measures": "device pool",
                            "allocated": 3 << 20, "reserved": 8 << 20, "peak": 5 << 20,
                            "cached": 5 << 20, "limit": 8 << 30, "allocations": 7, "total": 32 << 30}
    assert out["released"] == 5 << 20 and out["synchronized"] == 1
    if conf:
        assert out["conf"] == {conf: "expandable_segments:True"}
        assert "FL_EXPANDABLE_SEGMENTS=1 not applied" not in proc.stderr
    else:
        assert out["conf"] == {}
        assert f"FL_EXPANDABLE_SEGMENTS=1 not applied on backend {backend}" in proc.stderr


@pytest.mark.parametrize("environ, expected", [
    ({}, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}),
    # a user's deprecated variable alone is what torch reads: the option joins it
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"},
     {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}),
    # with both set torch reads PYTORCH_ALLOC_CONF only
    ({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8", "PYTORCH_CUDA_ALLOC_CONF": "x:1"},
     {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8,expandable_segments:True",
      "PYTORCH_CUDA_ALLOC_CONF": "x:1"}),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}, {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}),
])
def test_expandable_segments_join_the_variable_torch_reads(environ, expected):
    from flagos_torchfl.backends.cuda import CudaBackend
    from flagos_torchfl.machine.pools import add_allocator_option
    from flagos_torchfl.compat import parse_version

    if parse_version(torch.__version__)[:2] < (2, 9):
        pytest.skip("torch < 2.9 reads PYTORCH_CUDA_ALLOC_CONF only")
    variables = CudaBackend().allocator_conf_env
    assert variables == ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
    env = {"FL_EXPANDABLE_SEGMENTS": "1", **environ}
    changed = add_allocator_option(variables, env)
    del env["FL_EXPANDABLE_SEGMENTS"]
    assert env == expected
    assert (changed is None) == (environ == expected)
    assert add_allocator_option(variables, {"FL_EXPANDABLE_SEGMENTS": "0"}) is None


@pytest.mark.parametrize("started", [True, False])
def test_expandable_segments_set_after_the_runtime_started_warn(tmp_path, started):
    """A program that used the chip before activating: its allocator read its options already."""
    plugin = PLUGIN.format(module="torch_npu", device="npu") + f"mod.is_initialized = lambda: {started}\n"
    (tmp_path / "torch_npu.py").write_text(plugin)
    script = ("import os, torch_npu, flagos_torchfl as ft\n"
              "ft.init_backend('ascend')\n"
              "print(os.environ['PYTORCH_NPU_ALLOC_CONF'])\n")
    env = prepend_path({"FL_EXPANDABLE_SEGMENTS": "1"}, "PYTHONPATH", tmp_path)
    proc = run_python(["-c", script], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "expandable_segments:True"  # for children
    assert ("FL_EXPANDABLE_SEGMENTS=1 comes too late for this process: the ascend allocator"
            in proc.stderr) == started
