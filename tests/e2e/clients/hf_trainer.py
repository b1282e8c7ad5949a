"""A fine-tuning script in the style of the transformers examples: a tiny GPT-2 built from a
config (random weights, nothing downloaded), ``Trainer`` with ``bf16=True``, a checkpoint half-way,
then a second ``Trainer`` resumed from it. Prints one JSON line with both runs' loss histories.

Usage: hf_trainer.py OUTPUT_DIR [--cpu]   (``--cpu``: ``use_cpu=True``, as on a machine without a GPU)"""
import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

STEPS = 4


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n=32, length=16, vocab=128):
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build(output_dir, max_steps, use_cpu):
    set_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=4,
        learning_rate=1e-3, bf16=True, logging_steps=1, save_steps=2, save_strategy="steps",
        report_to=[], seed=0, use_cpu=use_cpu, data_seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )
    return Trainer(model=model, args=args, train_dataset=RandomTokens())


def losses(trainer):
    return [round(h["loss"], 6) for h in trainer.state.log_history if "loss" in h]


def main(output_dir, use_cpu):
    full = build(os.path.join(output_dir, "full"), STEPS, use_cpu)
    full.train()
    resumed = build(os.path.join(output_dir, "full"), STEPS, use_cpu)
    resumed.train(resume_from_checkpoint=os.path.join(output_dir, "full", "checkpoint-2"))
    print(json.dumps({"tag": "hf_trainer", "device": str(full.args.device),
                      "full": losses(full), "resumed": losses(resumed),
                      "param_device": str(next(full.model.parameters()).device)}))


if __name__ == "__main__":
    main(sys.argv[1], "--cpu" in sys.argv[2:])
