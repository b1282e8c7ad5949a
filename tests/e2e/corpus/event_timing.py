"""Timing with CUDA events and explicit synchronisation, as benchmarks and training loops do."""
import torch
import torch.nn as nn

torch.manual_seed(4)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(128, 64).cuda()
start = torch.cuda.Event(enable_timing=True)
end = torch.cuda.Event(enable_timing=True)
stream = torch.cuda.current_stream()
for step in range(5):
    start.record()
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    end.record(stream)
    torch.cuda.synchronize()
    ms = start.elapsed_time(end)
    assert ms >= 0.0
    print(f"loss {step} {loss.item()!r}")
    print(f"step_ms {step} {ms:.3f}")
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    extra = model(x).sum()
side.synchronize()
torch.cuda.current_stream().wait_stream(side)
print(f"loss final {extra.item()!r}")
