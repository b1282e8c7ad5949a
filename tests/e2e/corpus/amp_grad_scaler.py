"""Mixed precision the CUDA way: torch.autocast("cuda") and torch.amp.GradScaler("cuda")."""
# torch features: amp_grad_scaler
import torch
import torch.nn as nn

torch.manual_seed(3)
device = torch.device("cuda")
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(16, 32, device=device)
y = torch.randint(0, 8, (16,), device=device)
for step in range(6):
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda"):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    print(f"loss {step} {loss.item()!r}")
print("scale", scaler.get_scale())
