"""HF accelerate under torchrun: ``Accelerator()`` reads the torchrun environment, prepares the
model, optimizer and data loader, and ``accelerator.backward`` trains.

    torchrun --nproc_per_node=2 accelerate_torchrun.py OUT_DIR [--cpu]

``--cpu``: ``Accelerator(cpu=True)``, the reference. Each rank writes
``OUT_DIR/accelerate_torchrun.rank<r>.json``.
"""
import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from leave import leave, write_record  # the clients folder is sys.path[0]


def main(args):
    accelerator = Accelerator(cpu=args.cpu)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 2, generator=g))
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            losses.append(loss.item())
    unwrapped = accelerator.unwrap_model(model)
    rank = accelerator.process_index
    record = {"rank": rank, "losses": losses, "world": accelerator.num_processes,
              "params": [p.detach().cpu().flatten().tolist() for p in unwrapped.parameters()],
              "device": str(accelerator.device), "param_device": str(next(unwrapped.parameters()).device),
              "distributed_type": str(accelerator.distributed_type)}
    write_record(args.out, "accelerate_torchrun", record)
    accelerator.end_training()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cpu", action="store_true")
    main(parser.parse_args())
    leave()
