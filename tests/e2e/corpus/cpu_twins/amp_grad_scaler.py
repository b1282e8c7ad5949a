import torch
import torch.nn as nn

torch.manual_seed(3)
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler("cpu")
x = torch.randn(16, 32)
y = torch.randint(0, 8, (16,))
for step in range(6):
    optimizer.zero_grad()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    print(f"loss {step} {loss.item()!r}")
