import torch
import torch.nn as nn

torch.manual_seed(8)
model = nn.Linear(32, 32)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(64, 32)
for step in range(5):
    optimizer.zero_grad()
    loss = model(x).abs().mean()
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
