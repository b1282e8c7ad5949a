"""A CUDA-written DDP script, tiny: each rank trains a linear model on its own fixed batch for a
few steps, then writes its record (rank, group rank, world size, device, collective, losses,
final weights) to OUT/tiny_ddp.rankN.json.  Usage: tiny_ddp.py OUT [EXTRA]"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from leave import leave, write_record  # the clients folder is sys.path[0]

out = sys.argv[1]
dist.init_process_group("nccl")
rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1).cuda(), device_ids=[local_rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(rank)
x = torch.randn(16, 8, generator=generator).cuda()
y = x.sum(dim=1, keepdim=True)
losses = []
for _ in range(5):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
write_record(out, "tiny_ddp", {
    "rank": rank, "group_rank": int(os.environ["GROUP_RANK"]), "world_size": dist.get_world_size(),
    "device": x.device.type, "collective": dist.get_backend(), "losses": losses,
    "weights": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
    "argv": sys.argv[2:],
})
leave()
