"""``torch.compile`` of a 2-layer transformers GPT-2 (random weights from a config), written for a
GPU: the model and batch go to ``"cuda"``, eager and compiled forward+backward run on the same
batch. Prints one JSON line: both losses and gradient norms.

Usage: compile_gpt2.py [--eager-only]"""
import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = "cuda" if torch.cuda.is_available() else "cpu"


def step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    return loss.item(), norm.item()


def main(eager_only):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).to(device)
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(1)).to(device)
    result = {"tag": "compile", "device": str(next(model.parameters()).device)}
    result["eager_loss"], result["eager_grad_norm"] = step(model, ids)
    if not eager_only:
        compiled = torch.compile(model)
        result["compiled_loss"], result["compiled_grad_norm"] = step(compiled, ids)
    print(json.dumps(result))


if __name__ == "__main__":
    main("--eager-only" in sys.argv[1:])
