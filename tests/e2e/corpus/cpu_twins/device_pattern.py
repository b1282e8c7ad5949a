import torch
import torch.nn as nn

device = "cpu"
torch.manual_seed(0)
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x = torch.randn(64, 16).to(device)
y = torch.randint(0, 4, (64,)).to(device)
for step in range(8):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
