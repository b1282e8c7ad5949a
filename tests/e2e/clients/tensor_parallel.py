"""Tensor parallelism on a 2-D "cuda" device mesh (data-parallel x tensor-parallel), in the style
of PyTorch's FSDP + TP examples: the feed-forward layers are split column- then row-wise over
the "tp" dimension, the model is sharded with FSDP2 over the "dp" dimension.

    torchrun --nproc_per_node=2 tensor_parallel.py OUT_DIR [--cpu]

With 2 processes the mesh is 1 x 2. ``--cpu``: the reference run (plain gloo). Each rank writes
``OUT_DIR/tensor_parallel.rank<r>.json``.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from leave import end_group, leave, write_record  # the clients folder is sys.path[0]


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.in_proj = nn.Linear(dim, hidden)
        self.out_proj = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.out_proj(torch.relu(self.in_proj(x)))


def main(args):
    world = int(os.environ["WORLD_SIZE"])
    tp_size = 2
    if args.cpu:
        device_type = "cpu"
        dist.init_process_group("gloo")
    else:
        device_type = "cuda"
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    mesh = init_device_mesh(device_type, (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(FeedForward(16, 32), FeedForward(16, 32)).to(device_type)
    for block in model:
        parallelize_module(block, mesh["tp"], {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, foreach=False)
    losses = []
    for step in range(4):
        g = torch.Generator().manual_seed(step)  # every TP rank sees the same batch
        x = torch.randn(8, 16, generator=g).to(device_type)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    params = [p.full_tensor().detach().cpu().flatten().tolist() for p in model.parameters()]
    rank = dist.get_rank()
    record = {"rank": rank, "losses": losses, "params": params,
              "device": str(next(model.parameters()).to_local().device),
              "placements": str(model[0].in_proj.weight.placements)}
    write_record(args.out, "tensor_parallel", record)
    end_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cpu", action="store_true")
    main(parser.parse_args())
    leave()
