"""Multi-GPU training with DDP and snapshots, in the style of the PyTorch DDP tutorial series:
launched by torchrun, one process per GPU, a snapshot saved every ``--save-every`` epochs and
resumed from when the job is started again.

    torchrun --nproc_per_node=2 ddp_snapshot.py TOTAL_EPOCHS SAVE_EVERY SNAPSHOT OUT_DIR [--cpu]

``--cpu`` is the reference run: plain gloo on CPU tensors. Each rank writes
``OUT_DIR/ddp_snapshot.rank<r>.json`` (losses per epoch, its parameters, its device).
"""
import argparse
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from leave import activated, leave, write_record  # the clients folder is sys.path[0]


class MyTrainDataset(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(1)
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup(cpu):
    if cpu:
        init_process_group(backend="gloo")
        return
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, cpu):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.device = "cpu" if cpu else self.gpu_id
        self.model = model.to(self.device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.losses = {}
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=None if cpu else [self.gpu_id])

    def _load_snapshot(self, snapshot_path):
        loc = "cpu" if self.device == "cpu" else f"cuda:{self.gpu_id}"
        snapshot = torch.load(snapshot_path, map_location=loc)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        losses = []
        for source, targets in self.train_data:
            source = source.to(self.device)
            targets = targets.to(self.device)
            losses.append(self._run_batch(source, targets))
        self.losses[epoch] = losses

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.gpu_id == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def main(args):
    ddp_setup(args.cpu)
    torch.manual_seed(0)
    dataset = MyTrainDataset(64)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-1)
    train_data = DataLoader(dataset, batch_size=8, pin_memory=True, shuffle=False,
                            sampler=DistributedSampler(dataset))
    trainer = Trainer(model, train_data, optimizer, args.save_every, args.snapshot, args.cpu)
    trainer.train(args.total_epochs)
    rank = int(os.environ["RANK"])
    params = [p.detach().cpu().flatten().tolist() for p in trainer.model.module.parameters()]
    record = {"rank": rank, "losses": trainer.losses, "params": params,
              "device": str(next(trainer.model.parameters()).device)}
    write_record(args.out, "ddp_snapshot", record)
    if activated():  # as the tutorial ends; the plain reference leaves without it (see leave.py)
        destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("snapshot")
    parser.add_argument("out")
    parser.add_argument("--cpu", action="store_true", help="plain gloo on CPU tensors")
    main(parser.parse_args())
    leave()
