import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group(backend="gloo", init_method=f"file://{store}", rank=0, world_size=1)
torch.manual_seed(14)
model = DDP(nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
y = torch.randn(16, 2)
for step in range(5):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    reduced = loss.detach().clone()
    dist.all_reduce(reduced)
    print(f"loss {step} {reduced.item()!r}")
dist.barrier()
dist.destroy_process_group()
