"""A CUDA-written DeepSpeed ZeRO training script, meant for
``torchrun --nproc_per_node 2 deepspeed_zero.py STAGE``: ``deepspeed.init_distributed()``,
``torch.cuda.set_device(LOCAL_RANK)``, bf16, ``.cuda()`` inputs; a tiny regression model for a
few steps on one batch per rank. Each rank writes one JSON line (one write, so lines of ranks never mix) with its
rank, DeepSpeed's accelerator, the engine's device, the devices of the parameters (ZeRO-3: of
their partitions too) and of the inputs, and the per-step losses."""
import json
import os
import sys

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator

from leave import leave  # the clients folder is sys.path[0]

STEPS = 4


def main(stage: int) -> None:
    deepspeed.init_distributed()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
        "steps_per_print": 1000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank = torch.distributed.get_rank()
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(4, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1
    x, y = x.cuda().to(torch.bfloat16), y.cuda()  # the rank's batch, every step
    losses = []
    for _ in range(STEPS):
        loss = torch.nn.functional.mse_loss(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    params = list(engine.module.parameters())
    record = {
        "tag": "deepspeed", "rank": rank, "stage": stage, "world": torch.distributed.get_world_size(),
        "accelerator": get_accelerator().device_name(), "backend": torch.distributed.get_backend(),
        "engine_device": str(engine.device),
        "param_devices": sorted({str(p.device) for p in params}),
        "partition_devices": sorted({str(p.ds_tensor.device) for p in params if hasattr(p, "ds_tensor")}),
        "input_devices": sorted({str(x.device), str(y.device)}), "losses": losses,
    }
    os.write(1, (json.dumps(record) + "\n").encode())


if __name__ == "__main__":
    main(int(sys.argv[1]))
    leave()
