import torch
import torch.nn as nn

torch.manual_seed(6)
model = nn.Sequential(nn.Embedding(20, 8), nn.Flatten(), nn.Linear(8 * 5, 1))
tokens = torch.randint(0, 20, (12, 5))
target = torch.linspace(-1, 1, 12).unsqueeze(1)
optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
for step in range(6):
    optimizer.zero_grad()
    loss = nn.functional.smooth_l1_loss(model(tokens), target)
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
