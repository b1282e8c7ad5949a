import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)

images = torch.randn(64, 3, 8, 8)
labels = torch.randint(0, 5, (64,))
loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True)


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )


model = make_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)


def train(epoch):
    model.train()
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss {epoch}.{i} {loss.item()!r}")


train(0)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "ckpt.pt")
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, path)
    state = torch.load(path, map_location="cpu")
model = make_model()
model.load_state_dict(state["model"])
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
optimizer.load_state_dict(state["optim"])
train(1)
model.eval()
with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
    print(f"loss eval {nn.functional.cross_entropy(model(images), labels).item()!r}")
