"""A training loop in the style of the accelerate examples, meant for
``accelerate launch --multi_gpu --num_processes 2 accelerate_ddp.py``: ``Accelerator()`` prepares a
small regression model, its optimizer and a sharded DataLoader; each process writes one JSON line
with its rank, device, world size and per-step losses (one write, so lines of ranks never mix)."""
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from leave import leave  # the clients folder is sys.path[0]


def main():
    accelerator = Accelerator()
    set_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(accelerator.reduce(loss.detach(), "mean").item(), 6))
    weight = accelerator.unwrap_model(model)[0].weight.detach().sum().item()
    line = json.dumps({"tag": "accelerate", "rank": accelerator.process_index,
                       "world": accelerator.num_processes, "device": str(accelerator.device),
                       "distributed_type": str(accelerator.distributed_type),
                       "losses": losses, "weight_sum": round(weight, 6)})
    os.write(1, (line + "\n").encode())


if __name__ == "__main__":
    main()
    leave()
