"""A LightningModule fitted as in the Lightning docs: ``Trainer(accelerator=..., devices=N,
strategy=...)`` for a few steps. Each process writes one JSON line with its rank, the root
device, the world size and the final weights' sum.

Usage: lightning_fit.py ACCELERATOR DEVICES [STRATEGY]"""
import atexit
import json
import os
import sys

import lightning as L
import torch
from lightning.fabric.utilities.distributed import _destroy_dist_connection

from leave import activated, leave  # the clients folder is sys.path[0]


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(round(loss.item(), 6))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(accelerator, devices, strategy):
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model = Regression()
    trainer = L.Trainer(accelerator=accelerator, devices=devices, strategy=strategy, max_steps=4,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)
    line = json.dumps({"tag": "lightning", "rank": trainer.global_rank, "world": trainer.world_size,
                       "device": str(trainer.strategy.root_device), "losses": model.losses,
                       "weight_sum": round(sum(p.detach().sum().item() for p in model.parameters()), 6)})
    os.write(1, (line + "\n").encode())
    return trainer


def end(trainer) -> None:
    """Rank 0 started the other ranks (Lightning's subprocess launcher): wait for their records,
    then leave. Lightning registers ``destroy_process_group`` at exit when it asked for "nccl",
    which it does for ``accelerator="gpu"``: under flagos_torchfl that teardown runs. The plain
    reference skips it, like the interpreter's, since with gloo underneath it can deadlock in torch
    2.13 (see leave.py)."""
    for proc in getattr(trainer.strategy.launcher, "procs", None) or ():
        proc.wait()
    if not activated():
        atexit.unregister(_destroy_dist_connection)
    leave()


if __name__ == "__main__":
    end(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "auto"))
