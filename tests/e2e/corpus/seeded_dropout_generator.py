"""Determinism settings: cudnn flags, CUDA seeding, a CUDA Generator for shuffling, dropout."""
import random

import torch
import torch.nn as nn

random.seed(12)
torch.manual_seed(12)
torch.cuda.manual_seed(12)
torch.cuda.manual_seed_all(12)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

gen = torch.Generator(device="cuda")
gen.manual_seed(12)
model = nn.Sequential(nn.Linear(10, 20), nn.Dropout(0.3), nn.ReLU(), nn.Linear(20, 1)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(50, 10, device="cuda", generator=gen)
target = torch.randn(50, 1, device="cuda", generator=gen)
for step in range(6):
    order = torch.randperm(50, device="cuda", generator=gen)[:16]
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(data[order]), target[order])
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
state = torch.cuda.get_rng_state()
a = torch.rand(3, device="cuda")
torch.cuda.set_rng_state(state)
assert torch.equal(a, torch.rand(3, device="cuda"))
print(f"loss draw {torch.rand(1, device='cuda').item()!r}")
