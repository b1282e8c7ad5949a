"""Per-token latency of a small decoder on the sim: eager against a replayed device graph.

The decoder (``--layers`` pre-norm blocks of width ``--width``, 4 heads, a static key/value cache
of ``--context`` positions) decodes one token per step: the step writes the token's keys and values
into the cache at the current position, attends over the cache with a mask, and writes the greedy
next token into a static output. The same step runs eagerly and as a graph captured once with
``torch.cuda.graph`` (the static position and token are updated in place between replays); the
graph's tokens are checked equal to eager's. Eager and replayed runs of ``--tokens`` steps
alternate, ``--rounds`` times each, after a warm-up, on one intra-op thread; the figures are the medians of the per-token
times, in microseconds.

    python benchmarks/graphs.py [--backend sim] [--layers 2] [--width 64] [--context 64] [--tokens 32] [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def build(layers: int, width: int, context: int, vocab: int = 128):
    import torch

    torch.manual_seed(0)
    heads, head = 4, width // 4

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
            self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                           torch.nn.Linear(4 * width, width))
            self.register_buffer("k", torch.zeros(1, heads, context, head))
            self.register_buffer("v", torch.zeros(1, heads, context, head))

        def forward(self, x, position, mask):
            q, k, v = self.qkv(self.norm1(x)).view(1, 1, 3, heads, head).unbind(2)
            self.k.index_copy_(2, position, k.transpose(1, 2))
            self.v.index_copy_(2, position, v.transpose(1, 2))
            attended = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), self.k, self.v,
                                                                        attn_mask=mask)
            x = x + self.proj(attended.transpose(1, 2).reshape(1, 1, width))
            return x + self.mlp(self.norm2(x))

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, width)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.head = torch.nn.Linear(width, vocab)
            self.register_buffer("positions", torch.arange(context))

        def forward(self, token, position):
            mask = (self.positions <= position).view(1, 1, 1, context)
            x = self.embed(token).view(1, 1, width)
            for block in self.blocks:
                x = block(x, position, mask)
            return self.head(x).argmax(-1).view(1)

    return Decoder().cuda().eval()


def decode(step, token, position, out, tokens: int) -> list:
    """``tokens`` greedy steps from position 0; the tokens decoded."""
    import torch

    decoded = []
    token.fill_(1)
    for i in range(tokens):
        position.fill_(i)
        step()
        token.copy_(out)
        decoded.append(out)
    torch.cuda.synchronize()
    return [int(t) for t in torch.cat(decoded).cpu()]


def run(args) -> dict:
    import torch

    import flagos_torchfl as ft

    torch.set_num_threads(1)  # tiny kernels: a pool of threads only adds wake-ups, to both runs
    ft.init_backend(args.backend)
    model = build(args.layers, args.width, args.context)
    token = torch.ones(1, dtype=torch.long, device="cuda")
    position = torch.zeros(1, dtype=torch.long, device="cuda")
    out = torch.zeros(1, dtype=torch.long, device="cuda")

    def eager():
        with torch.no_grad():
            out.copy_(model(token, position))

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            eager()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        eager()
    expected = decode(eager, token, position, out, args.tokens)
    assert decode(graph.replay, token, position, out, args.tokens) == expected, "the graph decodes other tokens"
    times = {"eager": [], "replay": []}
    for _ in range(args.rounds):
        for name, step in (("eager", eager), ("replay", graph.replay)):
            start = time.perf_counter()
            decode(step, token, position, out, args.tokens)
            times[name].append((time.perf_counter() - start) / args.tokens * 1e6)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"backend": args.backend, "layers": args.layers, "width": args.width, "context": args.context,
            "tokens": args.tokens, "rounds": args.rounds, "eager_us_per_token": round(medians["eager"], 1),
            "replay_us_per_token": round(medians["replay"], 1),
            "speedup": round(medians["eager"] / medians["replay"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="sim")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    print(json.dumps(run(parser.parse_args()), indent=1))


if __name__ == "__main__":
    main()
