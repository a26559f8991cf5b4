"""A small ResNet on synthetic images: `raybridge.examples.resnet:build`.

The images are class prototypes plus noise, so the loss really falls. GroupNorm, not BatchNorm:
batch statistics would depend on how a step's batch is split, and the bridge changes the split
when the job shrinks or grows; with GroupNorm the training maths do not depend on the world size.
"""

from __future__ import annotations

import torch
from torch import nn

from ..workload import Workload


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.GroupNorm(4, channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.GroupNorm(4, channels),
        )

    def forward(self, x):
        return torch.relu(x + self.body(x))


def resnet(channels: int, blocks: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.GroupNorm(4, channels), nn.ReLU(),
        *[Block(channels) for _ in range(blocks)],
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes),
    )


def build(config: dict) -> Workload:
    seed = int(config.get("seed", 0))
    size, classes = int(config.get("image_size", 8)), int(config.get("classes", 10))
    global_batch = int(config.get("global_batch", 32))
    noise = float(config.get("noise", 1.0))
    torch.manual_seed(seed)
    model = resnet(int(config.get("channels", 8)), int(config.get("blocks", 2)), classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.05)), momentum=0.9)
    prototypes = torch.randn(classes, 3, size, size, generator=torch.Generator().manual_seed(seed + 1))

    def batch(step: int, first: int, stop: int):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        labels = torch.randint(0, classes, (global_batch,), generator=g)
        images = prototypes[labels] + noise * torch.randn(global_batch, 3, size, size, generator=g)
        return images[first:stop], labels[first:stop]

    def loss_sum(model_, samples):
        images, labels = samples
        return nn.functional.cross_entropy(model_(images), labels, reduction="sum")

    return Workload(model=model, optimizer=optimizer, batch=batch, loss_sum=loss_sum, global_batch=global_batch)
