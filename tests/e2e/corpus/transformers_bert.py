"""A transformers model built from a tiny config (random init, nothing downloaded), trained on "cuda"."""
import torch
from transformers import BertConfig, BertForSequenceClassification

torch.manual_seed(10)
torch.cuda.manual_seed_all(10)
config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=3)
model = BertForSequenceClassification(config).cuda()
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
input_ids = torch.randint(0, 64, (4, 16), device="cuda")
attention_mask = torch.ones_like(input_ids)
labels = torch.tensor([0, 1, 2, 1]).cuda()
for step in range(4):
    optimizer.zero_grad()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    out.loss.backward()
    optimizer.step()
    print(f"loss {step} {out.loss.item()!r}")
