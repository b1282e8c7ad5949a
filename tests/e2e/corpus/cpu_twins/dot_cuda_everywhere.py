import torch
import torch.nn as nn

torch.manual_seed(1)
torch.manual_seed(1)
model = nn.Sequential(nn.Linear(8, 24), nn.Tanh(), nn.Linear(24, 1))
criterion = nn.MSELoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
inputs = torch.randn(32, 8)
targets = inputs.sum(dim=1, keepdim=True)
noise = torch.randn(32, 1) * 0.01
for step in range(10):
    optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(inputs), targets + noise)
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
