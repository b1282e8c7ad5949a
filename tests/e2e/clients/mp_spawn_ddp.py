"""DDP started with torch.multiprocessing.spawn, one process per visible GPU
(``world_size = torch.cuda.device_count()``); rank 0 saves a checkpoint and every rank loads it
with ``map_location={"cuda:0": f"cuda:{rank}"}``.

    python mp_spawn_ddp.py OUT_DIR [--cpu]     (--cpu: 2 processes, plain gloo, the reference)

Each rank writes ``OUT_DIR/mp_spawn_ddp.rank<r>.json``.
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from leave import leave, write_record  # the clients folder is sys.path[0]


def run(rank, world_size, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    device = "cpu" if args.cpu else rank
    if args.cpu:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    else:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)).to(device)
    ddp_model = DDP(model, device_ids=None if args.cpu else [rank])
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    losses = []
    for step in range(3):
        g = torch.Generator().manual_seed(step * 10 + rank)
        outputs = ddp_model(torch.randn(20, 10, generator=g).to(device))
        loss = nn.functional.mse_loss(outputs, torch.randn(20, 5, generator=g).to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    path = os.path.join(args.out, "checkpoint.pt")
    if rank == 0:
        torch.save(ddp_model.state_dict(), path)
    dist.barrier()
    map_location = None if args.cpu else {"cuda:0": f"cuda:{rank}"}
    state = torch.load(path, map_location=map_location)
    ddp_model.load_state_dict(state)
    record = {"rank": rank, "world_size": world_size, "losses": losses,
              "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
              "device": str(next(model.parameters()).device),
              "loaded_devices": sorted({str(t.device) for t in state.values()})}
    write_record(args.out, "mp_spawn_ddp", record)
    leave()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    world_size = 2 if args.cpu else torch.cuda.device_count()
    mp.spawn(run, args=(world_size, args, free_port()), nprocs=world_size, join=True)
