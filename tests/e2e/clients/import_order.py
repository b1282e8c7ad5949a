"""Runs another client of this folder, unchanged, with torch.distributed's optional modules (FSDP1,
FSDP2, DTensor, tensor parallelism, device meshes, DCP) imported in a chosen order relative to
activation:

    torchrun --nproc_per_node=2 import_order.py ORDER CLIENT.py [ARGS...] [--next PORT CLIENT.py [ARGS...]]...

Clients chained with ``--next`` run one after another in the same processes, in the order set
up once (each imports what it needs after the ones before it: still in that order relative to
activation), as ``__main__`` with their own argv; each writes its own record. A chained client
starts its process group on a store of its own, which rank 0 serves on PORT (torchrun's store
still holds the keys of the group before it, and a new default group would reuse them).

- ``before``: the modules are imported, then the backend is activated (``FL_BACKEND``);
- ``after``: activation, then the client imports them itself;
- ``reactivated``: activation, ``ft.deactivate()``, activation again, then the client imports them;
- ``deactivated``: activation, ``ft.deactivate()``, then the modules are imported (and checked
  untouched: torch's own functions and methods), then activation again.
"""
import importlib
import os
import runpy
import sys

import torch

MODULES = ("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.tensor.parallel",
           "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
           "torch.distributed.device_mesh")


def import_modules():
    for name in MODULES:
        importlib.import_module(name)


def assert_untouched():
    """FSDP1, the mesh constructors and the functions taken by name are torch's own."""
    from torch.distributed import device_mesh, tensor
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._fully_shard import _fsdp_init

    assert not hasattr(FullyShardedDataParallel.__init__, "__wrapped__"), "FSDP1 patched after deactivation"
    assert not hasattr(device_mesh.DeviceMesh.__init__, "__wrapped__"), "DeviceMesh patched after deactivation"
    original = device_mesh.init_device_mesh
    assert not hasattr(original, "__wrapped__"), "init_device_mesh patched after deactivation"
    assert tensor.init_device_mesh is original and _fsdp_init.init_device_mesh is original


def clients(words):
    """``CLIENT.py ARGS... [--next PORT CLIENT.py ARGS...]...`` as [(port or None, client, args)]."""
    groups, current = [], []
    for word in [*words, "--next"]:
        if word != "--next":
            current.append(word)
        elif current:
            groups.append(current)
            current = []
    first, *rest = groups
    return [(None, first[0], first[1:])] + [(port, client, args) for port, client, *args in rest]


def main(order, chained):
    import flagos_torchfl as ft

    if order == "before":
        import_modules()
        ft.auto_select_backend()
    elif order == "after":
        ft.auto_select_backend()
    elif order == "reactivated":
        ft.auto_select_backend()
        ft.deactivate()
        ft.auto_select_backend()
    elif order == "deactivated":
        ft.auto_select_backend()
        ft.deactivate()
        import_modules()
        assert_untouched()
        ft.auto_select_backend()
    else:
        raise SystemExit(f"unknown order {order!r}: before, after, reactivated or deactivated")
    from flagos_torchfl import redirect

    # whether dynamo is imported yet decides whether the compile patch waits: `import torch` imports
    # it where an installed torch.backends plug-in does, a fresh environment's does not
    dynamo = "torch._dynamo.eval_frame" in sys.modules
    print(f"import_order {order}: dynamo imported {dynamo}; waiting for the import of "
          f"{redirect.waiting_patches()}", flush=True)
    for port, client, args in chained:
        if port is not None:  # rank 0 serves this client's store (torchelastic's own env:// way)
            os.environ.update(MASTER_PORT=port, TORCHELASTIC_USE_AGENT_STORE="False")
        sys.argv = [client, *args]
        runpy.run_path(client, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1], clients(sys.argv[2:]))
