"""torch.compile(model) on a model moved to "cuda"."""
import torch
import torch.nn as nn

torch.manual_seed(11)
model = nn.Sequential(nn.Linear(12, 12), nn.SiLU(), nn.Linear(12, 1)).to("cuda")
compiled = torch.compile(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(24, 12, device="cuda")
y = torch.randn(24, 1, device="cuda")
for step in range(4):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(compiled(x), y)
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
