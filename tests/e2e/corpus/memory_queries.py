"""Memory bookkeeping a training loop prints: allocated/reserved/peak, mem_get_info, properties."""
import gc

import torch
import torch.nn as nn

torch.manual_seed(8)
props = torch.cuda.get_device_properties(torch.cuda.current_device())
free, total = torch.cuda.mem_get_info()
print(f"gpu {props.name} total_memory {props.total_memory} free {free}/{total}")
model = nn.Linear(32, 32).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(64, 32, device="cuda")
torch.cuda.reset_peak_memory_stats()
for step in range(5):
    optimizer.zero_grad()
    loss = model(x).abs().mean()
    loss.backward()
    optimizer.step()
    allocated = torch.cuda.memory_allocated() / 2**20
    reserved = torch.cuda.memory_reserved() / 2**20
    peak = torch.cuda.max_memory_allocated() / 2**20
    print(f"loss {step} {loss.item()!r}")
    print(f"mem {step} allocated={allocated:.1f}MiB reserved={reserved:.1f}MiB peak={peak:.1f}MiB")
del x
gc.collect()
torch.cuda.empty_cache()
print(torch.cuda.memory_summary(abbreviated=True).splitlines()[0])
stats = torch.cuda.memory_stats()
print("stats keys", len(stats))
