"""A CUDA-written DDP job in one process (a gloo-backed group of size 1 under the cpu and sim
backends), ended as ``ENDING`` says: ``destroy`` (``dist.destroy_process_group()``), ``none``
(nothing), ``raise`` (an uncaught exception after training) or ``exit3`` (``sys.exit(3)``).

Usage: exit_job.py ENDING"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ending = sys.argv[1]
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.Linear(16, 4).to("cuda")
ddp = DDP(model, device_ids=[0])
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    ddp(torch.randn(8, 16, device="cuda")).sum().backward()  # each step's all-reduce holds the
    opt.step()                                                # backward's context (a Python object)
print("trained", flush=True)
if ending == "destroy":
    dist.destroy_process_group()
elif ending == "raise":
    raise RuntimeError("the program failed after training")
elif ending == "exit3":
    sys.exit(3)
