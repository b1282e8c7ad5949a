import torch
import torch.nn as nn

torch.manual_seed(5)
model = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 12, 2))
x = torch.randn(10, 4, 12)
y = torch.tensor([0, 1] * 5)
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
for step in range(6):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
