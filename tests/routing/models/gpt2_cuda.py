"""GPT-2 language model, random init, trained 3 steps -- written for CUDA."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from common import SIZE, host_randint, train

torch.manual_seed(0)
if SIZE == "base":
    config, batch, seq = GPT2Config(n_layer=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), 8, 128
else:
    config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    batch, seq = 4, 32
model = GPT2LMHeadModel(config).to("cuda")
ids = host_randint(config.vocab_size, (batch, seq)).to(device="cuda")
train(model, {"input_ids": ids, "labels": ids})
