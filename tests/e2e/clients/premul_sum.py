"""``ReduceOp.PREMUL_SUM(factor)``, written for CUDA (NCCL has it): ``all_reduce`` and
``reduce_scatter_tensor`` with a factor, and FSDP2 with ``set_gradient_divide_factor`` (what
torchtitan sets), whose reduce-scatter takes ``PREMUL_SUM(1 / factor)``.

    torchrun --nproc_per_node=2 premul_sum.py OUT_DIR

Each rank writes ``OUT_DIR/premul_sum.rank<r>.json``: every result with what NCCL's definition
gives (each input multiplied by the factor, then summed), or the error a call raised.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from leave import end_group, leave, write_record  # the clients folder is sys.path[0]

WORLD = 2


def attempt(record, key, fn):
    try:
        record[key] = fn()
    except Exception as e:  # the record carries what the library said
        record[key] = {"error": f"{type(e).__name__}: {e}"}


def all_reduce(rank):
    t = torch.full((4,), rank + 1.0, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.PREMUL_SUM(0.5))
    return {"got": t.tolist(), "expected": [0.5 * sum(r + 1.0 for r in range(WORLD))] * 4}


def reduce_scatter(rank):
    inputs = [torch.arange(4, dtype=torch.float32) + 10 * r for r in range(WORLD)]
    source = inputs[rank].to("cuda")
    out = torch.empty(2, device="cuda")
    dist.reduce_scatter_tensor(out, source, op=dist._make_nccl_premul_sum(0.25))
    expected = (0.25 * sum(inputs))[2 * rank:2 * rank + 2]
    return {"got": out.tolist(), "expected": expected.tolist(),
            "input_kept": source.tolist() == inputs[rank].tolist()}


def fsdp_divide_factor(rank):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3, bias=False)
    reference = model.weight.detach().clone()
    fully_shard(model.cuda())
    model.set_gradient_divide_factor(3.0)
    inputs = [torch.full((2, 4), r + 1.0) for r in range(WORLD)]
    model(inputs[rank].cuda()).sum().backward()
    expected = torch.zeros_like(reference)
    for x in inputs:  # d(sum(x @ W.T)) / dW, summed over ranks, divided by the factor
        expected += torch.ones(2, 3).T @ x
    return {"got": model.weight.grad.full_tensor().cpu().flatten().tolist(),
            "expected": (expected / 3.0).flatten().tolist()}


def main(args):
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    record = {"rank": dist.get_rank(), "device": str(torch.ones(1, device="cuda").device)}
    attempt(record, "all_reduce", lambda: all_reduce(rank))
    attempt(record, "reduce_scatter", lambda: reduce_scatter(rank))
    attempt(record, "fsdp_divide_factor", lambda: fsdp_divide_factor(rank))
    write_record(args.out, "premul_sum", record)
    end_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    main(parser.parse_args())
    leave()
