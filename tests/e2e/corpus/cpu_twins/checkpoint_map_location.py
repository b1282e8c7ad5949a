import os
import tempfile

import torch
import torch.nn as nn

torch.manual_seed(9)
model = nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
x = torch.randn(40, 5)
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
    path = os.path.join(tmp, "ckpt.pt")
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(), "step": 4}, path)
    checkpoint = torch.load(path, map_location="cpu")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optim"])
train(4, checkpoint["step"])
