"""Save a checkpoint under a path that contains "cuda", load it with map_location="cuda:0", resume."""
import os
import sys
import tempfile

import torch
import torch.nn as nn

torch.manual_seed(9)
model = nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 1)).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
x = torch.randn(40, 5).cuda()
y = x[:, :1].clone()


def train(steps, first):
    for step in range(first, first + steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss {step} {loss.item()!r}")


train(4, 0)
with tempfile.TemporaryDirectory() as tmp:
    os.makedirs(os.path.join(tmp, "runs"))
    path = os.path.join(tmp, "runs", "cuda_ckpt.pt")
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(), "step": 4}, path)
    checkpoint = torch.load(path, map_location="cuda:0")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optim"])
    again = torch.load(path, map_location={"cuda:0": "cuda:0"}, weights_only=True)
    assert torch.equal(again["model"]["0.weight"], checkpoint["model"]["0.weight"])
    print("checkpoint", os.path.basename(path), file=sys.stderr)
train(4, checkpoint["step"])
