import torch
import torch.nn as nn

torch.manual_seed(2)
model = nn.Linear(10, 3)
head = nn.Linear(3, 1)
optimizer = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.1)
data = torch.randn(20, 10)
target = torch.zeros(20, 1)
bias = torch.full((20, 1), 0.5)
for step in range(6):
    optimizer.zero_grad()
    out = head(torch.relu(model(data)))
    loss = ((out - target - bias) ** 2).mean()
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
