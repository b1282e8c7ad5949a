"""A small training script written for NVIDIA CUDA, as people write them.

Run it unchanged on whatever chip is here:
    python -m flagos_torchfl run examples/train_cuda.py
"""
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)

model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cuda")

x = torch.randn(256, 32, device="cuda")
y = torch.randint(0, 4, (256,), device=device)

start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for step in range(20):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda"):
        loss = nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    if step % 5 == 0:
        print(f"step {step:2d} loss {loss.item():.4f}")
end.record()
torch.cuda.synchronize()

print(f"device: {torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} visible)")
print(f"20 steps in {start.elapsed_time(end):.1f} ms, "
      f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
