"""One rank of the distributed tests (started twice with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set, as torchrun sets them).

    python collectives_rank.py MODE OUT_DIR SCENARIO[,SCENARIO...]

MODE ``sim``: two sim devices, this rank on ``sim:<rank>``, the staged collectives registered as
``simccl`` and the group created with ``"cpu:gloo,sim:simccl"``; ``simonly``: the same with the
group created with ``"simccl"`` alone; ``cpu``: plain gloo on CPU tensors, the reference.
Each scenario saves ``{"ok": True, "result": ..., "staged": ...}`` (CPU tensors) or
``{"ok": False, "error": traceback}`` to ``OUT_DIR/<scenario>.rank<r>.pt``.
"""
from __future__ import annotations

import atexit
import datetime
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
BIT_OPS = ("BAND", "BOR", "BXOR")
EXTRA_NATIVE = "threshold_backward"
"""Operators the models need beyond the sim's default native set (the routing layer, which
would give them a route, is not activated here)."""


def host(value):
    """``value`` with every tensor moved to the CPU (lists, tuples and dicts kept)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(host(v) for v in value)
    if isinstance(value, dict):
        return {k: host(v) for k, v in value.items()}
    return value


def data(device, n=6, dtype=torch.float32, salt=0):
    """Rank-dependent values that round differently under each reduction."""
    g = torch.Generator().manual_seed(100 * RANK + salt)
    if dtype.is_floating_point:
        t = torch.randn(n, generator=g).to(dtype) / 3
    else:
        t = torch.randint(1, 1 << 10, (n,), generator=g).to(dtype)
    return t.to(device)


# -- scenarios -------------------------------------------------------------------------------
def collectives(device):
    out = {}
    for name in OPS:
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            t = data(device, dtype=dtype, salt=len(out))
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
            out[f"all_reduce.{name}.{dtype}"] = t
    for name in BIT_OPS:
        t = data(device, dtype=torch.int64, salt=len(out))
        dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
        out[f"all_reduce.{name}"] = t
    pair = [data(device, 3, salt=1), data(device, 5, salt=2)]
    dist.all_reduce_coalesced(pair, op=dist.ReduceOp.AVG)
    out["all_reduce_coalesced.AVG"] = pair
    t = data(device, salt=3)
    dist.broadcast(t, src=1)
    out["broadcast"] = t
    outs = [torch.empty(6, device=device) for _ in range(WORLD)]
    dist.all_gather(outs, data(device, salt=4))
    out["all_gather"] = outs
    o = torch.empty(6 * WORLD, device=device)
    dist.all_gather_into_tensor(o, data(device, salt=5))
    out["all_gather_into_tensor"] = o
    with dist._coalescing_manager(async_ops=True) as cm:
        a, b = torch.empty(4 * WORLD, device=device), torch.empty(2 * WORLD, device=device)
        dist.all_gather_into_tensor(a, data(device, 4, salt=6))
        dist.all_gather_into_tensor(b, data(device, 2, salt=7))
    cm.wait()
    out["all_gather_into_tensor.coalesced"] = [a, b]
    lists = [[torch.empty(2, device=device), torch.empty(3, device=device)] for _ in range(WORLD)]
    dist.all_gather_coalesced(lists, [data(device, 2, salt=26), data(device, 3, salt=27)])
    out["all_gather_coalesced"] = lists
    for name in ("SUM", "AVG", "MAX"):
        o = torch.empty(3, device=device)
        dist.reduce_scatter(o, [data(device, 3, salt=8 + r) for r in range(WORLD)],
                            op=getattr(dist.ReduceOp, name))
        out[f"reduce_scatter.{name}"] = o
        o = torch.empty(3, device=device)
        dist.reduce_scatter_tensor(o, data(device, 3 * WORLD, salt=10), op=getattr(dist.ReduceOp, name))
        out[f"reduce_scatter_tensor.{name}"] = o
    with dist._coalescing_manager(async_ops=True) as cm:
        a, b = torch.empty(2, device=device), torch.empty(3, device=device)
        dist.reduce_scatter_tensor(a, data(device, 2 * WORLD, salt=11), op=dist.ReduceOp.AVG)
        dist.reduce_scatter_tensor(b, data(device, 3 * WORLD, salt=12), op=dist.ReduceOp.AVG)
    cm.wait()
    out["reduce_scatter_tensor.coalesced"] = [a, b]
    o = torch.empty(8, device=device)
    dist.all_to_all_single(o, data(device, 8, salt=13))
    out["all_to_all_single"] = o
    splits_in = [1, 4] if RANK == 0 else [2, 3]
    splits_out = [1, 2] if RANK == 0 else [4, 3]
    o = torch.empty(sum(splits_out), device=device)
    dist.all_to_all_single(o, data(device, 5, salt=14), splits_out, splits_in)
    out["all_to_all_single.uneven"] = o
    outs = [torch.empty(3, device=device) for _ in range(WORLD)]
    dist.all_to_all(outs, [data(device, 3, salt=15 + r) for r in range(WORLD)])
    out["all_to_all"] = outs
    gathered = [torch.empty(4, device=device) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(data(device, 4, salt=17), gathered, dst=0)
    out["gather"] = gathered
    o = torch.empty(4, device=device)
    dist.scatter(o, [data(device, 4, salt=18 + r) for r in range(WORLD)] if RANK == 1 else None, src=1)
    out["scatter"] = o
    t = data(device, salt=20)
    dist.reduce(t, dst=1, op=dist.ReduceOp.MAX)
    out["reduce.MAX"] = t if RANK == 1 else None
    t = data(device, salt=21)
    dist.reduce(t, dst=0, op=dist.ReduceOp.AVG)
    out["reduce.AVG"] = t if RANK == 0 else None
    dist.barrier()
    t = data(device, salt=22)
    if RANK == 0:
        dist.send(t, dst=1)
        dist.recv(t, src=1)
    else:
        r = torch.empty(6, device=device)
        dist.recv(r, src=0)
        dist.send(r * 2, dst=0)
        t = r
    out["send_recv"] = t
    t = data(device, salt=23)
    r = torch.empty(6, device=device)
    ops = [dist.P2POp(dist.isend, t, 1 - RANK), dist.P2POp(dist.irecv, r, 1 - RANK)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch_isend_irecv"] = r
    if RANK == 0:
        r = torch.empty(6, device=device)
        out["recv_anysource.src"] = dist.recv(r)
        out["recv_anysource"] = r
    else:
        dist.send(data(device, salt=24), dst=0)
    with torch.inference_mode():  # inference tensors are written only under inference mode (Ultralytics' validation)
        for name in ("SUM", "AVG"):
            t = data(device, salt=28)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
            out[f"inference_mode.all_reduce.{name}"] = t
        t = data(device, salt=29)
        dist.reduce(t, dst=0, op=dist.ReduceOp.AVG)
        out["inference_mode.reduce.AVG"] = t if RANK == 0 else None
    leaf = data(device, salt=30).requires_grad_()
    dist.broadcast(leaf, src=0)  # an in-place write into a leaf that requires grad, grad mode on
    out["broadcast.leaf_requiring_grad"] = leaf.detach()
    out["devices"] = sorted({str(v.device.type) for v in _tensors(out)})
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "t": data("cpu", 2, salt=25)})
    out["all_gather_object"] = objs
    lst = [RANK * 10, "x"] if RANK == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    out["broadcast_object_list"] = lst
    return out


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def async_handles(device):
    out = {}
    t = data(device, salt=30)
    if RANK == 1:
        time.sleep(1.5)  # rank 0's work cannot finish before this rank joins
    work = dist.all_reduce(t, async_op=True)
    out["completed_before_peer"] = work.is_completed()
    fut = work.get_future()
    chained = fut.then(lambda f: [x * 2 for x in f.value()])
    out["wait"] = work.wait()
    out["completed_after_wait"] = work.is_completed()
    value = fut.value()
    out["future_value_is_tensor"] = len(value) == 1 and value[0] is t
    out["future_value_device"] = value[0].device.type
    out["all_reduce"] = t
    out["chained"] = chained.wait()
    o = torch.empty(6 * WORLD, device=device)
    w1 = dist.all_gather_into_tensor(o, data(device, salt=31), async_op=True)
    o2 = torch.empty(3, device=device)
    w2 = dist.reduce_scatter_tensor(o2, data(device, 6, salt=32), async_op=True)
    w1.wait(), w2.wait()
    out["all_gather_into_tensor"], out["reduce_scatter_tensor"] = o, o2
    r = torch.empty(6, device=device)
    w = dist.irecv(r, src=1 - RANK)
    dist.isend(data(device, salt=33), dst=1 - RANK).wait()
    w.wait()
    out["irecv"] = r
    out["irecv_completed"] = w.is_completed()
    dist.barrier()
    return out


def faults(device):
    """A peer that never joins: the wait of an async all-reduce on a group with a short timeout
    raises on the rank that started it; integer AVG is refused at the wait."""
    out = {}
    backend = dist.get_backend_config()
    quick = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2), backend=backend)
    if RANK == 0:
        work = dist.all_reduce(data(device, salt=40), group=quick, async_op=True)
        try:
            work.wait()
            out["timeout_error"] = None
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            out["timeout_error"] = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    try:
        dist.all_reduce(torch.arange(4, device=device), op=dist.ReduceOp.AVG, async_op=True).wait()
        out["int_avg_error"] = None
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        out["int_avg_error"] = f"{type(exc).__name__}: {exc}"
    t = data(device, salt=41)
    dist.all_reduce(t)
    out["after"] = t
    return out


def _mlp(device, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)


def _batch(device, step):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(5, 8, generator=g).to(device), torch.randn(5, 4, generator=g).to(device)


def ddp(device):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = {}
    for variant in ("default", "hook"):
        model = _mlp(device, seed=RANK)  # different on each rank: DDP broadcasts rank 0's
        kwargs = {"device_ids": [RANK]} if device.type != "cpu" else {}
        ddp_model = DDP(model, **kwargs)
        if variant == "hook":
            ddp_model.register_comm_hook(None, default_hooks.allreduce_hook)
        opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
        losses = []
        for step in range(3):
            x, y = _batch(device, step)
            loss = (ddp_model(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        out[variant] = {"losses": losses, "params": [p.detach() for p in model.parameters()],
                        "device": next(model.parameters()).device.type}
    return out


def fsdp2(device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (WORLD,))
    model = _mlp(device)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
    losses = []
    for step in range(3):
        x, y = _batch(device, step)
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    params = [p.full_tensor() for p in model.parameters()]
    local = [p.to_local() for p in model.parameters()]
    return {"losses": losses, "params": params, "local_shards": local,
            "device": local[0].device.type}


def dtensor(device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(device.type, (WORLD,))
    torch.manual_seed(5)
    a = torch.randn(4, 6).to(device)
    b = torch.randn(6, 4).to(device)
    da = distribute_tensor(a, mesh, [Shard(0)])
    db = distribute_tensor(b, mesh, [Shard(0)])
    prod = (da @ db).redistribute(mesh, [Replicate()])
    resharded = da.redistribute(mesh, [Shard(1)])
    total = da.sum()
    return {"matmul": prod.to_local(), "matmul_placements": str(prod.placements),
            "reshard_local": resharded.to_local(), "sum": total.full_tensor(),
            "device": prod.to_local().device.type}


def dcp(device):
    import torch.distributed.checkpoint as dcp_api
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (WORLD,))
    model = _mlp(device, seed=3)
    fully_shard(model, mesh=mesh)
    state = get_model_state_dict(model)
    path = os.path.join(os.environ["CKPT_DIR"], device.type)
    dcp_api.save(state, checkpoint_id=path)
    saved = {k: v.full_tensor() for k, v in state.items()}
    fresh = _mlp(device, seed=4)
    fully_shard(fresh, mesh=mesh)
    before = {k: v.full_tensor() for k, v in get_model_state_dict(fresh).items()}
    target = get_model_state_dict(fresh)
    dcp_api.load(target, checkpoint_id=path)
    set_model_state_dict(fresh, target)
    after = {k: v.full_tensor() for k, v in get_model_state_dict(fresh).items()}
    return {"saved": saved, "before": before, "after": after,
            "device": next(iter(target.values())).to_local().device.type,
            "files": sorted(os.listdir(path))}


SCENARIOS = {f.__name__: f for f in (collectives, async_handles, faults, ddp, fsdp2,
                                     dtensor, dcp)}


def main() -> int:
    mode, out_dir, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    staged = None
    if mode in ("sim", "simonly"):
        import flagos_torchfl.sim as fsim
        from flagos_torchfl.sim.integration import collectives as staged

        native = fsim.default_native_ops() | fsim.parse_native_ops(EXTRA_NATIVE)
        fsim.install(num_devices=WORLD, native_ops=native)
        torch.sim.set_device(RANK)
        staged.register("sim", "simccl")
        device = torch.device("sim", RANK)
        backend = "cpu:gloo,sim:simccl" if mode == "sim" else "simccl"
    elif mode == "cpu":
        device, backend = torch.device("cpu"), "gloo"
    else:
        raise SystemExit(f"unknown mode {mode!r}: sim, simonly or cpu")
    os.environ.setdefault("CKPT_DIR", tempfile.mkdtemp())
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    for name in names:
        if staged is not None:
            staged.reset()
        try:
            record = {"ok": True, "result": host(SCENARIOS[name](device))}
        except Exception:  # noqa: BLE001 - the test reports it
            record = {"ok": False, "error": traceback.format_exc()}
        if staged is not None:
            record["staged"] = staged.stats()
        torch.save(record, os.path.join(out_dir, f"{name}.rank{RANK}.pt"))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # torch 2.13 with gloo: interpreter teardown can deadlock when a collective launched during
    # backward is freed on gloo's thread (it needs the GIL for the autograd context torch keeps in
    # thread-local state) while teardown frees the process group. The records are written: run the
    # exit handlers (the launcher's report among them) and leave.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

