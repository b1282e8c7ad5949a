"""Activation checkpointing as large-model recipes use it, written for a GPU: a transformers GPT-2
(random weights from a config, dropout on) on ``"cuda"``, two training steps with
``model.gradient_checkpointing_enable()`` and the same two steps without, from the same seeds.
Prints one JSON line: the losses and every parameter's gradient after each step, per mode.

Usage: checkpointing_dropout.py"""
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = "cuda" if torch.cuda.is_available() else "cpu"


def steps(checkpointing):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.3, embd_pdrop=0.3, attn_pdrop=0.3)
    model = GPT2LMHeadModel(config).to(device)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    torch.cuda.manual_seed(123)
    for _ in range(2):
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.detach().cpu().flatten().tolist() for p in model.parameters() if p.grad is not None])
        optimizer.step()
    return {"losses": losses, "grads": grads}


if __name__ == "__main__":
    print(json.dumps({"tag": "checkpointing", "device": device if device == "cpu" else str(torch.empty(0, device=device).device),
                      "plain": steps(False), "checkpointed": steps(True)}))
