"""Older style: .cuda() on every model and tensor, CUDA-generator seeding, Adam."""
import torch
import torch.nn as nn

torch.cuda.manual_seed(1)
torch.manual_seed(1)
model = nn.Sequential(nn.Linear(8, 24), nn.Tanh(), nn.Linear(24, 1)).cuda()
criterion = nn.MSELoss().cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
inputs = torch.randn(32, 8).cuda()
targets = inputs.sum(dim=1, keepdim=True).cuda(non_blocking=True)
noise = torch.randn(32, 1, device="cuda") * 0.01
for step in range(10):
    optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(inputs), targets + noise)
    loss.backward()
    optimizer.step()
    print(f"loss {step} {loss.item()!r}")
