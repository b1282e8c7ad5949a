"""FSDP2 with a distributed checkpoint, written for CUDA: the model is built and moved to the GPU
before sharding, a "cuda" device mesh, torch.distributed.checkpoint save and load, training
continued from the loaded state.

    torchrun --nproc_per_node=2 fsdp2_dcp.py CKPT_DIR OUT_DIR [--cpu]

``--cpu`` is the reference run (plain gloo, CPU tensors). Each rank writes
``OUT_DIR/fsdp2_dcp.rank<r>.json``.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from leave import end_group, leave, write_record  # the clients folder is sys.path[0]


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, dim=16, depth=2):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build(device_type, mesh, seed):
    torch.manual_seed(seed)
    model = Model().to(device_type)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    return model, optim


def train(model, optim, device_type, steps, start):
    rank = dist.get_rank()
    losses = []
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 16, generator=g).to(device_type)
        y = torch.randn(8, 4, generator=g).to(device_type)
        loss = nn.functional.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(loss.item())
    return losses


def main(args):
    rank = int(os.environ["LOCAL_RANK"])
    if args.cpu:
        device_type = "cpu"
        dist.init_process_group("gloo")
    else:
        device_type = "cuda"
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl")
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    model, optim = build(device_type, mesh, seed=0)
    losses = train(model, optim, device_type, 3, 0)
    model_state, optim_state = get_state_dict(model, optim)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=args.ckpt)

    fresh, fresh_optim = build(device_type, mesh, seed=1)
    model_state, optim_state = get_state_dict(fresh, fresh_optim)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=args.ckpt)
    set_state_dict(fresh, fresh_optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    losses += train(fresh, fresh_optim, device_type, 2, 3)
    params = [p.full_tensor().detach().cpu().flatten().tolist() for p in fresh.parameters()]
    record = {"rank": dist.get_rank(), "losses": losses, "params": params,
              "device": str(next(fresh.parameters()).to_local().device)}
    write_record(args.out, "fsdp2_dcp", record)
    end_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt")
    parser.add_argument("out")
    parser.add_argument("--cpu", action="store_true")
    main(parser.parse_args())
    leave()
