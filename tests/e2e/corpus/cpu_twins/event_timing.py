import torch
import torch.nn as nn

torch.manual_seed(4)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(128, 64)
for step in range(5):
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
extra = model(x).sum()
print(f"loss final {extra.item()!r}")
