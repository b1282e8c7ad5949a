"""ResNet image classifier (resnet-50 layout), random init, trained 3 steps -- written for CUDA."""
import torch
from transformers import ResNetConfig, ResNetForImageClassification

from common import SIZE, host_randint, host_randn, train

torch.manual_seed(0)
if SIZE == "base":
    config, batch, side = ResNetConfig(num_labels=10), 8, 224
else:
    config = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck",
                          num_labels=10)
    batch, side = 4, 32
model = ResNetForImageClassification(config).cuda()
pixels = host_randn((batch, 3, side, side)).cuda()
labels = host_randint(config.num_labels, (batch,)).cuda()
train(model, {"pixel_values": pixels, "labels": labels})
