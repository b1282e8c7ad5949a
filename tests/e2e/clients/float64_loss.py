"""A CUDA training script whose loss is computed in float64: on a chip without float64 every
step takes host fallbacks. INIT_IN_CODE=1 activates through ft.init_backend instead of the
launcher."""
import os

import torch

if os.environ.get("INIT_IN_CODE") == "1":
    import flagos_torchfl as ft

    ft.init_backend("sim")

torch.manual_seed(0)
model = torch.nn.Linear(8, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8).cuda()
for step in range(3):
    loss = model(x).double().pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.6f}", flush=True)
print("DONE", flush=True)
