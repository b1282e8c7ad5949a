"""A DataLoader with worker processes and pin_memory=True, batches moved with non_blocking."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(7)
    features = torch.randn(96, 6)
    labels = (features[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(features, labels), batch_size=16, shuffle=True, num_workers=2,
                        pin_memory=True, generator=torch.Generator().manual_seed(7))
    model = nn.Linear(6, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    step = 0
    for epoch in range(2):
        for xb, yb in loader:
            xb = xb.cuda(non_blocking=True)
            yb = yb.to("cuda", non_blocking=True)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            print(f"loss {step} {loss.item()!r}")
            step += 1


if __name__ == "__main__":
    main()
