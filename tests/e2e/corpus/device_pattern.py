"""The classic pattern: pick "cuda" when available, move model and data with .to(device)."""
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x = torch.randn(64, 16).to(device)
y = torch.randint(0, 4, (64,)).to(device)
print("device", device, torch.cuda.get_device_name(0))
for step in range(8):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
