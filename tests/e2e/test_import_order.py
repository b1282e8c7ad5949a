"""The order of imports does not matter: FSDP1 (device_id), FSDP2 with DCP and tensor parallelism
(DTensor on a 2-D device mesh) train the same with torch.distributed's optional modules imported
before activation, after it, after a re-activation, and after a deactivation (then checked
untouched) followed by a new activation. Each client runs unchanged with 2 processes under
torchrun through ``clients/import_order.py``, which activates with ``ft.auto_select_backend()``,
against the same client run plainly with gloo on CPU tensors. One torchrun job per order and
backend runs the three clients one after another (the order is what is set up before them; a
failing client fails the job, and so every case of it).

The patches of those modules wait for the program's import (``waits_for``); each run prints
which patches still wait once the order is set up, proving which order it really ran.
The modules imported (:data:`HARNESS_NEEDS`) and each client's needs (test_distributed_clients.NEEDS)
are compat features of the torch under test: without them a case is skipped, not launched.
"""
from __future__ import annotations

import ast
import concurrent.futures

import pytest

from flagos_torchfl import compat
from flagos_torchfl.redirect.patches import REGISTRY
from tests.e2e.test_distributed_clients import (CLIENTS, NEEDS, _run, _torchrun, assert_trained_like, client_marks,
                                                 records, runnable)
from tests.helpers import free_port

ORDER = str(CLIENTS / "import_order.py")
#: what clients/import_order.py imports and checks (DCP's state_dict, device meshes, FSDP2)
HARNESS_NEEDS = ("dcp_state_dict", "device_mesh", "fsdp2")
#: client -> extra arguments before the output folder
CLIENT_ARGS = {"fsdp1_device_id": [], "fsdp2_dcp": ["{out}/ckpt"], "tensor_parallel": []}
#: the patches that wait for dynamo's modules, in registry order
DYNAMO_PATCHES = [p.name for p in REGISTRY if (p.waits_for or "").startswith("torch._dynamo.")]
#: the patches that wait for Inductor's modules (first in the registry), which these clients never import
INDUCTOR_PATCHES = [p.name for p in REGISTRY if (p.waits_for or "").startswith("torch._inductor.")]
#: (order, backend) runs of every client; "after" under the launcher is test_distributed_clients' case
RUNS = [("before", "sim"), ("after", "sim"), ("reactivated", "sim"), ("deactivated", "sim"),
        ("before", "cpu"), ("deactivated", "cpu")]
#: the patches still waiting when the client starts training: FSDP1's unless the program imported
#: FSDP first, and accelerate's and DeepSpeed's (these programs import neither); the compile
#: patch's too where dynamo is not imported yet (:func:`_expected`)
LIBRARIES = ["accelerate_device", "deepspeed_accelerator", "triton_launches", "flex_attention"]
WAITING = {"before": LIBRARIES, "deactivated": LIBRARIES, "after": ["fsdp_device_id", *LIBRARIES],
           "reactivated": ["fsdp_device_id", *LIBRARIES]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each client's plain reference, and one job per (order, backend) of :data:`RUNS` that runs
    every client runnable there, chained in the same two processes (``--next``): the order is
    set up once, and each client still imports its modules in that order relative to activation."""
    root = tmp_path_factory.mktemp("orders")
    jobs, chains = {}, {}
    for client, extra in CLIENT_ARGS.items():
        script = str(CLIENTS / f"{client}.py")
        for order, backend in [("ref", "cpu"), *RUNS]:
            if not _runnable(client, backend):
                continue
            folder = root / (f"{client}.ref" if order == "ref" else f"{order}.{backend}")
            folder.mkdir(exist_ok=True)
            args = [script, *[a.format(out=folder) for a in extra], str(folder)]
            if order == "ref":
                jobs[(client, order, backend)] = (lambda argv=_torchrun(*args, "--cpu"): _run(argv), folder)
            else:
                chains.setdefault((order, backend), (folder, []))[1].append((client, args))
    for (order, backend), (folder, chained) in chains.items():
        argv = _torchrun(ORDER, order, *[word for i, (_, args) in enumerate(chained)
                                          for word in (["--next", str(free_port())] if i else []) + args])
        job = (lambda argv=argv, backend=backend: _run(argv, env={"FL_BACKEND": backend}), folder)
        for client, _ in chained:
            jobs[(client, order, backend)] = job
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {}
        for key, (job, _) in jobs.items():
            if job not in futures:
                futures[job] = pool.submit(job)
        return {"|".join(key): (futures[job].result(), folder) for key, (job, folder) in jobs.items()}


def _runnable(client: str, backend: str) -> bool:
    return runnable(client, backend) and all(compat.has(name) for name in HARNESS_NEEDS)


def _cases() -> list:
    return [pytest.param(client, order, backend, id=f"{client}-{order}-{backend}",
                         marks=client_marks(client, backend) + [pytest.mark.torch_feature(n) for n in HARNESS_NEEDS
                                                                if n not in NEEDS[client]])
            for client in CLIENT_ARGS for order, backend in RUNS]


def _waiting(proc) -> list:
    """Per rank: (whether dynamo was imported, the patches waiting) as the client printed them."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("import_order ")]
    assert len(lines) == 2, proc.stdout[-2000:] + proc.stderr[-3000:]  # one per rank
    found = []
    for line in lines:
        head, waiting = line.split("; waiting for the import of ", 1)
        found.append((head.endswith("dynamo imported True"), ast.literal_eval(waiting)))
    return found


def _expected(order: str, dynamo: bool) -> list:
    """The patches that wait in ``order``: :data:`WAITING`, after the compile patches (those
    waiting for dynamo's modules, first in the registry) where ``torch._dynamo.eval_frame`` was
    not imported yet. Whether it is depends on the environment, not on the order: a fresh
    environment's ``import torch`` does not import dynamo (2.1, 2.13 and 2.14 alike), an installed
    ``torch.backends`` plug-in that does makes it imported in every process."""
    return INDUCTOR_PATCHES + ([] if dynamo else DYNAMO_PATCHES) + WAITING[order]


@pytest.mark.parametrize("client, order, backend", _cases())
def test_client_trains_the_same_whatever_the_import_order(runs, client, order, backend):
    name = f"{client}|{order}|{backend}"
    got = records(runs, name, client)
    ref = records(runs, f"{client}|ref|cpu", client)
    assert_trained_like(got, ref, exact=backend == "cpu", what=f"{client} {order} on {backend}")
    for rank in (0, 1):
        device = got[rank].get("param_device", got[rank]["device"])
        assert device == ("cpu" if backend == "cpu" else f"sim:{rank}"), device
    proc, _ = runs[name]
    assert proc.returncode == 0, proc.stderr[-3000:]
    for dynamo, waiting in _waiting(proc):
        assert waiting == _expected(order, dynamo)
