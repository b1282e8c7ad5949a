"""Legacy APIs still common in the wild: torch.cuda.amp.autocast/GradScaler, torch.cuda.FloatTensor,
x.type(torch.cuda.FloatTensor), nvtx ranges."""
# torch features: amp_grad_scaler
import warnings

import torch
import torch.nn as nn

warnings.simplefilter("ignore", FutureWarning)
torch.manual_seed(13)
model = nn.Linear(6, 3).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.cuda.amp.GradScaler()
x = torch.randn(8, 6).type(torch.cuda.FloatTensor)
y = torch.cuda.LongTensor([0, 1, 2, 0, 1, 2, 0, 1])
assert isinstance(x, torch.cuda.FloatTensor)
for step in range(5):
    torch.cuda.nvtx.range_push(f"step{step}")
    optimizer.zero_grad()
    with torch.cuda.amp.autocast():
        loss = nn.functional.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.cuda.nvtx.range_pop()
    print(f"loss {step} {loss.item()!r}")
