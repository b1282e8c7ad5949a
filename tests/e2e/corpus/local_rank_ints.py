"""torchrun-style code: LOCAL_RANK ints everywhere (set_device, .to(int), device=int, .cuda(int))."""
import os

import torch
import torch.nn as nn

local_rank = int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.set_device(local_rank)
torch.manual_seed(2)
model = nn.Linear(10, 3).cuda(local_rank)
head = nn.Linear(3, 1, device=local_rank)
optimizer = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.1)
data = torch.randn(20, 10).to(local_rank)
target = torch.zeros(20, 1, device=local_rank)
bias = torch.full((20, 1), 0.5, device=torch.device("cuda", local_rank))
print("current device", torch.cuda.current_device())
for step in range(6):
    optimizer.zero_grad()
    out = head(torch.relu(model(data)))
    loss = ((out - target - bias) ** 2).mean()
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
