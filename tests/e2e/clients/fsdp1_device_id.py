"""FullyShardedDataParallel (FSDP1) the CUDA way: the model is built on the CPU and FSDP moves it
to ``device_id=torch.cuda.current_device()``; the full parameters are gathered at the end.

    torchrun --nproc_per_node=2 fsdp1_device_id.py OUT_DIR [--cpu]

``--cpu``: the reference run (plain gloo, FSDP1 on CPU). Each rank writes
``OUT_DIR/fsdp1_device_id.rank<r>.json``.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from leave import end_group, leave, write_record  # the clients folder is sys.path[0]


def main(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.cpu:
        dist.init_process_group("gloo")
        kwargs = {"device_id": torch.device("cpu")}
        device = torch.device("cpu")
    else:
        dist.init_process_group("nccl")
        torch.cuda.set_device(local_rank)
        kwargs = {"device_id": torch.cuda.current_device()}
        device = torch.device("cuda", local_rank)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 3))
    model = FSDP(model, use_orig_params=True, **kwargs)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    losses = []
    for step in range(4):
        g = torch.Generator().manual_seed(10 * step + dist.get_rank())
        x, y = torch.randn(6, 12, generator=g).to(device), torch.randn(6, 3, generator=g).to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with FSDP.summon_full_params(model):
        params = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    rank = dist.get_rank()
    record = {"rank": rank, "losses": losses, "params": params,
              "device": str(next(model.parameters()).device)}
    write_record(args.out, "fsdp1_device_id", record)
    end_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cpu", action="store_true")
    main(parser.parse_args())
    leave()
