import torch
import torch.nn as nn

torch.manual_seed(13)
model = nn.Linear(6, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
x = torch.randn(8, 6).type(torch.FloatTensor)
y = torch.LongTensor([0, 1, 2, 0, 1, 2, 0, 1])
for step in range(5):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(f"loss {step} {loss.item()!r}")
