"""The small image classifier both training examples use (examples/train.py with zerowait,
examples/dataloader_train.py with PyTorch's DataLoader), so the two do the same compute."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    """Three conv blocks (the first with stride 2, to stay cheap on a CPU), global average
    pooling, one linear layer."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()

        def block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU(inplace=True), nn.MaxPool2d(2))

        self.features = nn.Sequential(block(3, 16, stride=2), block(16, 32), block(32, 64))
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
