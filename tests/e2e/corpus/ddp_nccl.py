"""DistributedDataParallel the NVIDIA way: nccl, set_device(local_rank), device_ids=[local_rank]."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.set_device(local_rank)
store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group(backend="nccl", init_method=f"file://{store}", rank=0, world_size=1)
torch.manual_seed(14)
model = DDP(nn.Linear(4, 2).cuda(local_rank), device_ids=[local_rank], output_device=local_rank)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4).cuda(local_rank)
y = torch.randn(16, 2).cuda(local_rank)
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
