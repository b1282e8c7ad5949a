"""PyTorch's official FSDP2 example (``distributed/FSDP2/example.py`` in pytorch/examples), call
for call: the device named from ``torch.accelerator`` and never set by the program
(``torch.accelerator.device_index(rank)`` without ``with`` does nothing: ``DeviceMesh`` sets it
from ``LOCAL_RANK`` because the runtime is not initialised yet), the process group from
``get_default_backend_for_device`` bound to the device, the model built on the meta device,
sharded with ``fully_shard`` in bfloat16 mixed precision, materialised with ``to_empty`` and
initialised with ``reset_parameters()`` (DTensor random ops, which use the device generator's
seed/offset state), trained with gradient clipping, saved with torch.distributed.checkpoint, loaded
into a fresh model and trained on. The same steps also run without the save/load in between, as
the reference for the resume.

    torchrun --nproc_per_node=2 fsdp2_meta_init.py CKPT_DIR OUT_DIR

Each rank writes ``OUT_DIR/fsdp2_meta_init.rank<r>.json``: losses with and without the resume,
the full parameters after init, its own shard of the first weight, the RNG state's size, the
current device index and the unsharded parameters' dtype.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from leave import leave, write_record  # the clients folder is sys.path[0]


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.drop(torch.relu(self.fc1(x))))

    def reset_parameters(self):
        self.fc1.reset_parameters()
        self.fc2.reset_parameters()


class Model(nn.Module):
    def __init__(self, dim=16, depth=2):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    def reset_parameters(self):
        for layer in self.layers:
            layer.reset_parameters()
        self.head.reset_parameters()


def build(device):
    torch.manual_seed(0)  # the same seed on every rank, as the example does
    with torch.device("meta"):
        model = Model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    model.to_empty(device=device)
    model.reset_parameters()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)


def unsharded_dtype(model):  # the example's inspect_mixed_precision, on the root's own group
    model.unshard()
    dtypes = {str(p.dtype) for p in model.head.parameters()}
    model.reshard()
    return sorted(dtypes)


def train(model, optim, steps, start):
    rank = dist.get_rank()
    losses = []
    for step in range(start, start + steps):
        torch.cuda.manual_seed(1000 + step)  # dropout masks: the same in both runs
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 16, generator=g).cuda()
        y = torch.randn(8, 4, generator=g).cuda()
        loss = nn.functional.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        losses.append(loss.item())
    return losses


def full(model):
    return [p.full_tensor().detach().cpu().flatten().tolist() for p in model.parameters()]


def main(args):
    rank = int(os.environ["LOCAL_RANK"])
    device_type = torch.accelerator.current_accelerator()
    device = torch.device(f"{device_type}:{rank}")
    torch.accelerator.device_index(rank)  # as the example: a context manager never entered
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend, device_id=device)
    model, optim = build(device)
    record = {"rank": dist.get_rank(), "init_params": full(model),
              "current_device": torch.accelerator.current_device_index(),
              "unsharded_dtype": unsharded_dtype(model),
              "first_shard": model.layers[0].fc1.weight.to_local().detach().cpu().flatten().tolist(),
              "rng_state_bytes": torch.cuda.get_rng_state().numel(),
              "device": str(model.layers[0].fc1.weight.to_local().device)}
    losses = train(model, optim, 3, 0)
    model_state, optim_state = get_state_dict(model, optim)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=args.ckpt)
    straight = losses + train(model, optim, 2, 3)

    fresh, fresh_optim = build(device)
    model_state, optim_state = get_state_dict(fresh, fresh_optim)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=args.ckpt)
    set_state_dict(fresh, fresh_optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    record["straight_losses"] = straight
    record["resumed_losses"] = losses + train(fresh, fresh_optim, 2, 3)
    record["final_params"] = full(fresh)
    record["straight_params"] = full(model)
    write_record(args.out, "fsdp2_meta_init", record)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt")
    parser.add_argument("out")
    main(parser.parse_args())
    leave()
