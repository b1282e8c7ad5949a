"""The patches of torch.distributed's optional modules (FSDP1, the device mesh constructors and the
modules that take them by name, DCP's device query) in each import order, in a fresh interpreter
per order, on the cpu backend with a one-process gloo group: the patched objects while active,
torch's own objects after deactivation, and real use (``init_process_group("nccl")``, meshes,
DTensor, FSDP1 ``device_id="cuda:0"``, FSDP2, a DCP save and load) working the same whatever the
order. The 2-process training runs of the same orders are tests/distributed/test_import_order.py.
"""
from __future__ import annotations

import pytest

from tests.helpers import run_python

CHECK = r'''
import importlib, os, sys, tempfile
import torch
import flagos_torchfl as ft
from flagos_torchfl import redirect

order, tmp = sys.argv[1], sys.argv[2]
TORCH_DIR = os.path.dirname(torch.__file__)
MODULES = ("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.tensor.parallel",
           "torch.distributed.checkpoint", "torch.distributed.checkpoint.filesystem")
OPTIONAL = ("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint",
            "torch.distributed._composable")


def import_modules():
    for name in MODULES:
        importlib.import_module(name)


def functions():
    """name -> the function now in place at each place the redirection may change."""
    from torch.distributed import device_mesh, tensor
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._fully_shard import _fsdp_init
    return {
        "FSDP.__init__": vars(FullyShardedDataParallel)["__init__"],
        "DeviceMesh.__init__": vars(device_mesh.DeviceMesh)["__init__"],
        "device_mesh.init_device_mesh": device_mesh.init_device_mesh,
        "dist.init_device_mesh": torch.distributed.init_device_mesh,
        "tensor.init_device_mesh": tensor.init_device_mesh,
        "_fsdp_init.init_device_mesh": _fsdp_init.init_device_mesh,
        "filesystem._get_available_device_type": filesystem._get_available_device_type,
        "_init_utils._move_states_to_device": sys.modules["torch.distributed.fsdp._init_utils"]._move_states_to_device,
    }


def owners():
    return {name: f.__code__.co_filename.startswith(TORCH_DIR) for name, f in functions().items()}


def assert_torchs_own():
    own = owners()
    assert all(own.values()), [name for name, mine in own.items() if not mine]


if order == "before":
    import_modules()
    ft.init_backend("cpu")
elif order == "after":
    ft.init_backend("cpu")
    assert not [m for m in OPTIONAL if m in sys.modules], "activation imported an optional module"
    assert "fsdp_device_id" in redirect.waiting_patches()
    import_modules()
elif order == "reactivated":
    ft.init_backend("cpu")
    ft.deactivate()
    ft.init_backend("cpu")
    import_modules()
elif order == "deactivated":
    ft.init_backend("cpu")
    ft.deactivate()
    import_modules()
    assert_torchs_own()
    ft.init_backend("cpu")
# every patch of an imported module is applied; the others (deepspeed's) still wait for theirs
modules = {p.name: p.waits_for for p in redirect.REGISTRY}
late = [n for n in redirect.waiting_patches() if modules[n] in sys.modules]
assert late == [], late
own = owners()
# on the cpu backend FSDP1 moves parameters as torch does: _move_states_to_device stays torch's
expected = {name: name == "_init_utils._move_states_to_device" for name in own}
assert own == expected, own
meshes = {functions()[n] for n in ("device_mesh.init_device_mesh", "dist.init_device_mesh",
                                   "tensor.init_device_mesh", "_fsdp_init.init_device_mesh")}
assert len(meshes) == 1, meshes  # one wrapper everywhere

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

dist.init_process_group("nccl", init_method="file://" + os.path.join(tmp, "store"), rank=0, world_size=1)
assert dist.get_backend() == "gloo"
mesh = init_device_mesh("cuda", (1,))
assert mesh.device_type == "cpu" and DeviceMesh("cuda", [0]).device_type == "cpu"
shared = distribute_tensor(torch.arange(4.0, device="cuda"), mesh, [Shard(0)])
assert shared.device_mesh.device_type == "cpu" and shared.full_tensor().tolist() == [0.0, 1.0, 2.0, 3.0]
torch.manual_seed(0)
one = FullyShardedDataParallel(nn.Linear(4, 2), device_id="cuda:0")
one(torch.randn(3, 4, device="cuda")).sum().backward()
assert one.compute_device == torch.device("cpu")
two = nn.Linear(4, 2).cuda()
fully_shard(two, mesh=mesh)
two(torch.randn(3, 4, device="cuda")).sum().backward()
state = {"model": two.state_dict()}
dcp.save(state, checkpoint_id=os.path.join(tmp, "ckpt"))
dcp.load(state, checkpoint_id=os.path.join(tmp, "ckpt"))
ft.deactivate()
assert_torchs_own()
assert not [f for f in sys.meta_path if type(f).__name__ == "ImportHook"]
print("ok", flush=True)
os._exit(0)  # no gloo teardown at exit (torch 2.13's exit race, see tests/distributed/clients/leave.py)
'''


@pytest.mark.torch_feature("device_mesh")
@pytest.mark.torch_feature("fsdp2")
@pytest.mark.parametrize("order", ["before", "after", "reactivated", "deactivated"])
def test_distributed_patches_whatever_the_import_order(order, tmp_path):
    proc = run_python(["-c", CHECK, order, str(tmp_path)], timeout=300)
    assert proc.stdout.strip() == "ok", proc.stdout[-2000:] + proc.stderr[-4000:]
