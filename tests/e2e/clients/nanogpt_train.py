"""A minimal GPT trainer in the style of the popular nanoGPT ``train.py``, with its default
configuration: ``device = 'cuda'``, ``torch.amp.autocast(device_type='cuda', dtype=bfloat16)``
around forward and loss, ``torch.compile(model)``, fused AdamW when on CUDA, a GradScaler enabled
only for float16, TF32 flags, pinned non-blocking batches, tied embedding/head weights and
``F.scaled_dot_product_attention(is_causal=True)``. The model is tiny (one layer) so that
compilation stays short.

For each ``--dtypes`` entry it trains the same steps eagerly and compiled (from the same seed) and
prints one JSON line: both loss lists per dtype.

Usage: nanogpt_train.py [--dtypes bfloat16,float32] [--steps 3]"""
import argparse
import inspect
import json
import math
from contextlib import nullcontext

import torch
import torch.nn as nn
from torch.nn import functional as F

device = "cuda"
batch_size, block_size, vocab_size = 4, 16, 64
n_layer, n_head, n_embd, dropout = 1, 2, 32, 0.0
learning_rate, weight_decay, beta1, beta2, grad_clip = 6e-4, 1e-1, 0.9, 0.95, 1.0


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout if self.training else 0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def configure_optimizers(self, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        use_fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(beta1, beta2),
                                 **({"fused": True} if use_fused else {}))


data = torch.randint(0, vocab_size, (2048,), generator=torch.Generator().manual_seed(7))


def get_batch(step):
    g = torch.Generator().manual_seed(step)
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=g)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)


def run(dtype, compile, steps):
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device_type = "cuda" if "cuda" in device else "cpu"
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
    model = GPT().to(device)
    scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
    optimizer = model.configure_optimizers(device_type)
    if compile:
        model = torch.compile(model)
    losses = []
    for step in range(steps):
        X, Y = get_batch(step)
        with ctx:
            _, loss = model(X, Y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    record = {"tag": "nanogpt", "device": str(torch.empty(0, device=device).device)}
    for dtype in args.dtypes.split(","):
        record[dtype] = {"eager": run(dtype, False, args.steps), "compiled": run(dtype, True, args.steps)}
    print(json.dumps(record))


if __name__ == "__main__":
    main()
