"""Peak resident memory of saving a checkpoint: ``torch.save(state, path)`` against
``ft.save(state, path)`` (streamed, atomic replace) for state dicts of a given size.

Each sample is a fresh interpreter that builds ``{"w": <SIZE float32 tensor>}`` (pages touched),
reads its peak RSS (``getrusage`` ``ru_maxrss``), saves to a path in a temporary directory under
``--dir`` (over the previous sample's file) and reads its peak RSS again; the sample is the
growth, i.e. what saving costs on top of the tensor. The saved file is checked to load back equal. torch and ft samples alternate, the
order flipping every pair; the figures are medians.

    python benchmarks/checkpoint_memory.py [--sizes 256,1024] [--pairs 3] [--dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 2 ** 20


def child(mode: str, mib: int, path: str) -> None:
    import resource

    import torch

    torch.set_num_threads(1)
    state = {"w": torch.ones(mib * MiB // 4, dtype=torch.float32)}
    if mode == "ft":
        import flagos_torchfl as ft

        save = ft.save
    else:
        save = torch.save
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    save(state, path)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    loaded = torch.load(path, mmap=True)
    assert torch.equal(loaded["w"], state["w"]), "the checkpoint does not load back equal"
    print(json.dumps({"mode": mode, "growth": after - before, "seconds": seconds}))


def sample(mode: str, mib: int, path: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FL_")}
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--sizes", str(mib), "--dir", path],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256,1024", help="state dict sizes in MiB, comma-separated")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--child", choices=("torch", "ft"))
    args = parser.parse_args()
    if args.child:
        return child(args.child, int(args.sizes), args.dir)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        path = os.path.join(directory, "checkpoint.pt")
        for mib in (int(s) for s in args.sizes.split(",")):
            samples = {"torch": [], "ft": []}
            for i in range(args.pairs):
                for mode in (("torch", "ft") if i % 2 == 0 else ("ft", "torch")):
                    samples[mode].append(sample(mode, mib, path))
                print(f"{mib} MiB pair {i}: " + ", ".join(
                    f"{m} +{s[-1]['growth'] / MiB:.1f} MiB in {s[-1]['seconds']:.2f} s" for m, s in samples.items()),
                    flush=True)
            growth = {m: statistics.median(x["growth"] for x in s) / MiB for m, s in samples.items()}
            seconds = {m: statistics.median(x["seconds"] for x in s) for m, s in samples.items()}
            print(f"{mib} MiB median peak-RSS growth: torch.save +{growth['torch']:.1f} MiB, ft.save "
                  f"+{growth['ft']:.1f} MiB (difference {growth['ft'] - growth['torch']:+.1f} MiB); "
                  f"median time torch.save {seconds['torch']:.2f} s, ft.save {seconds['ft']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
