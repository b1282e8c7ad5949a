"""A CUDA-written image classifier: DataLoader, conv + batch norm, AdamW, autocast, a checkpoint
saved mid-run and loaded back with map_location, then training resumes from it."""
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
torch.cuda.manual_seed_all(3)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

images = torch.randn(64, 3, 8, 8)
labels = torch.randint(0, 5, (64,))
loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True, pin_memory=True)


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )


model = make_model().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)


def train(epoch):
    model.train()
    for i, (x, y) in enumerate(loader):
        x, y = x.cuda(non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda"):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss {epoch}.{i} {loss.item()!r}")


train(0)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "cuda_ckpt.pt")
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, path)
    state = torch.load(path, map_location="cuda:0")
model = make_model().cuda()
model.load_state_dict(state["model"])
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
optimizer.load_state_dict(state["optim"])
train(1)
model.eval()
with torch.no_grad(), torch.cuda.amp.autocast():
    print(f"loss eval {nn.functional.cross_entropy(model(images.cuda()), labels.cuda()).item()!r}")
