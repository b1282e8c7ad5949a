"""BERT masked-LM, random init, trained 3 steps -- written for CUDA."""
import torch
from transformers import BertConfig, BertForMaskedLM

from common import SIZE, host_randint, train

torch.manual_seed(0)
if SIZE == "base":
    config, batch, seq = BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), 8, 128
else:
    config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    batch, seq = 4, 32
model = BertForMaskedLM(config).cuda()
ids = host_randint(config.vocab_size, (batch, seq)).cuda()
train(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
