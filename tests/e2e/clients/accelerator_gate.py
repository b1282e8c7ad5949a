"""An FSDP2 script written against ``torch.accelerator``, as PyTorch's own distributed examples
now are: it looks for two accelerators, exits 0 with a message when there are fewer, and builds
its mesh on the accelerator's device type.

    torchrun --nproc_per_node=2 accelerator_gate.py OUT_DIR
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from leave import end_group, leave, write_record  # the clients folder is sys.path[0]


def main(out):
    if torch.accelerator.device_count() < 2:
        print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
        sys.exit(0)
    device_type = torch.accelerator.current_accelerator().type
    rank = int(os.environ["LOCAL_RANK"])
    torch.accelerator.set_device_index(rank)
    dist.init_process_group()
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)).to(device_type)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step + 10 * rank)).to(device_type)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    record = {"rank": dist.get_rank(), "losses": losses, "device_type": device_type,
              "params": [p.full_tensor().detach().cpu().flatten().tolist() for p in model.parameters()]}
    write_record(out, "accelerator_gate", record)
    end_group()


if __name__ == "__main__":
    main(sys.argv[1])
    leave()
