"""DDP with a distributed checkpoint (``torch.distributed.checkpoint``'s ``save_state_dict`` and
``load_state_dict``, the API every supported torch has) written for CUDA: train, save the model's
and optimizer's state, load it into a fresh model and optimizer, train on.

    torchrun --nproc_per_node=2 ddp_dcp.py CKPT_DIR OUT_DIR [--cpu]

``--cpu``: the reference run (plain gloo on CPU tensors). Each rank writes
``OUT_DIR/ddp_dcp.rank<r>.json``: losses before and after the load, the loaded parameters against
the saved ones, the final parameters, the same steps taken by the saved model itself (``straight``),
the device and the process group's backend. Its backend is chosen as trainers written for CUDA
choose it: ``"nccl" if dist.is_nccl_available() else "gloo"``.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from leave import end_group, leave, write_record  # the clients folder is sys.path[0]


def build(device, ddp_kwargs):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2)).to(device), **ddp_kwargs)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def steps(model, optimizer, device, first, count):
    losses = []
    for step in range(first, first + count):
        g = torch.Generator().manual_seed(10 * step + dist.get_rank())
        x, y = torch.randn(8, 10, generator=g).to(device), torch.randn(8, 2, generator=g).to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main(args):
    if args.cpu:
        dist.init_process_group("gloo")
        device, ddp_kwargs = torch.device("cpu"), {}
    else:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        # as trainers written for CUDA choose their backend (Ultralytics and many more)
        dist.init_process_group("nccl" if dist.is_nccl_available() else "gloo")
        device = torch.device("cuda", local_rank)
        ddp_kwargs = {"device_ids": [local_rank], "output_device": local_rank}
    model, optimizer = build(device, ddp_kwargs)
    losses = steps(model, optimizer, device, 0, 3)
    saved = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    dcp.save_state_dict({"model": model.state_dict(), "optim": optimizer.state_dict()},
                        dcp.FileSystemWriter(args.ckpt))
    fresh, fresh_optimizer = build(device, ddp_kwargs)
    steps(fresh, fresh_optimizer, device, 100, 1)  # moved away from the saved state, momentum made
    state = {"model": fresh.state_dict(), "optim": fresh_optimizer.state_dict()}
    dcp.load_state_dict(state, dcp.FileSystemReader(args.ckpt))
    fresh.load_state_dict(state["model"])
    fresh_optimizer.load_state_dict(state["optim"])
    loaded = [p.detach().cpu().flatten().tolist() for p in fresh.parameters()]
    losses += steps(fresh, fresh_optimizer, device, 3, 3)
    straight = steps(model, optimizer, device, 3, 3)
    record = {"rank": dist.get_rank(), "losses": losses, "loaded_equals_saved": loaded == saved,
              "params": [p.detach().cpu().flatten().tolist() for p in fresh.parameters()],
              "straight_losses": straight,
              "straight_params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
              "device": str(next(fresh.parameters()).device), "backend": dist.get_backend()}
    write_record(args.out, "ddp_dcp", record)
    end_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt")
    parser.add_argument("out")
    parser.add_argument("--cpu", action="store_true")
    main(parser.parse_args())
    leave()
