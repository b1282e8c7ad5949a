"""DDP with ``find_unused_parameters=True``, as detection and multi-task trainers set it: a model
whose auxiliary head takes part only in some steps, so DDP's reducer must find, every step, which
parameters got no gradient (it keeps a map of the used ones in pinned host memory on an
accelerator, copied to the device without blocking).

    torchrun --nproc_per_node=2 ddp_unused.py OUT_DIR [--cpu]

``--cpu`` is the reference run: plain gloo on CPU tensors. Each rank writes
``OUT_DIR/ddp_unused.rank<r>.json``: its losses, its parameters, their device, and whether the
auxiliary head's weight was updated only in the steps that used it.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from leave import end_group, leave, write_record  # the clients folder is sys.path[0]


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.main = nn.Linear(16, 1)
        self.aux = nn.Linear(16, 1)

    def forward(self, x, use_aux):
        h = self.trunk(x)
        out = self.main(h)
        return out + self.aux(h) if use_aux else out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    if args.cpu:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl")
        device = torch.device("cuda", rank)
    torch.manual_seed(0)
    model = TwoHeads().to(device)
    ddp = DDP(model, device_ids=None if args.cpu else [rank], find_unused_parameters=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    losses, aux_changed = [], []
    for step in range(6):
        x = torch.randn(4, 8, generator=g).to(device)
        y = torch.randn(4, 1, generator=g).to(device)
        use_aux = step % 3 == 0
        before = model.aux.weight.detach().clone()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(x, use_aux), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        aux_changed.append(bool((model.aux.weight.detach() != before).any().item()))
    write_record(args.out, "ddp_unused", {
        "rank": rank, "losses": losses, "device": str(next(model.parameters()).device),
        "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
        "aux_changed": aux_changed,
    })
    end_group()
    leave()


if __name__ == "__main__":
    main()
