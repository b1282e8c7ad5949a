"""Profiling a GPU training step as the torch.profiler tutorial does:
``profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])`` around a few steps of a small
model on ``"cuda"`` (after a warm-up step). Prints one JSON line: the profiled wall time, the summed
self CPU time of all events, and the number of ``aten::addmm`` calls recorded."""
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)
x = torch.randn(32, 64, device=device)
model(x).sum().backward()  # warm-up outside the profiled region

start = time.perf_counter()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        with record_function("train_step"):
            model(x).sum().backward()
wall = time.perf_counter() - start
events = prof.key_averages()
print(json.dumps({
    "tag": "profile", "wall_ms": round(wall * 1000, 3),
    "self_cpu_ms": round(sum(e.self_cpu_time_total for e in events) / 1000, 3),
    "addmm_calls": sum(e.count for e in events if e.key == "aten::addmm"),
    "train_steps": sum(e.count for e in events if e.key == "train_step"),
}))
