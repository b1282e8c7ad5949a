import random

import torch
import torch.nn as nn

random.seed(12)
torch.manual_seed(12)
torch.manual_seed(12)
torch.manual_seed(12)

gen = torch.Generator(device="cpu")
gen.manual_seed(12)
model = nn.Sequential(nn.Linear(10, 20), nn.Dropout(0.3), nn.ReLU(), nn.Linear(20, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(50, 10, generator=gen)
target = torch.randn(50, 1, generator=gen)
for step in range(6):
    order = torch.randperm(50, generator=gen)[:16]
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(data[order]), target[order])
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
state = torch.get_rng_state()
a = torch.rand(3)
torch.set_rng_state(state)
torch.rand(3)
print(f"loss draw {torch.rand(1).item()!r}")
