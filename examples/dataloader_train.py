#!/usr/bin/env python3
"""The usual way: a small image classifier trained from a tree of JPEG files through PyTorch's
DataLoader, one file opened, read and decoded per sample. It imports nothing of zerowait's.

    python examples/dataloader_train.py --data images/ --steps 200
    zerowait watch --out before -- python examples/dataloader_train.py --data images/

It is the "before" of docs/observe.md: ``zerowait watch`` attributes its wait from outside, then
the same training through zerowait (examples/train.py on the packed tree, the same model, batch
size, image size and checkpoints) is the "after". Checkpoints are ``torch.save`` in the loop.

``--data`` is an ImageFolder: one directory per class holding that class's images.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from small_cnn import SmallCNN  # beside this file

MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class ImageFiles(torch.utils.data.Dataset):
    """(path, class) pairs of an ImageFolder; each item is opened, decoded, randomly cropped
    to a square, resized and flipped: what torchvision's RandomResizedCrop pipeline does."""

    def __init__(self, root: str, size: int) -> None:
        self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.items = [(os.path.join(root, c, f), i) for i, c in enumerate(self.classes)
                      for f in sorted(os.listdir(os.path.join(root, c)))]
        self.size = size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        path, label = self.items[index]
        with Image.open(path) as image:
            image = image.convert("RGB")
            side = int(min(image.size) * np.random.uniform(0.35, 1.0))
            left = np.random.randint(0, image.width - side + 1)
            top = np.random.randint(0, image.height - side + 1)
            image = image.resize((self.size, self.size), box=(left, top, left + side, top + side))
            if np.random.rand() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = torch.from_numpy(np.asarray(image).copy())
        return pixels, label


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="an ImageFolder tree of JPEG files")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--checkpoint", default=None, help="directory for torch.save checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    dataset = ImageFiles(args.data, args.image_size)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers, drop_last=True,
                                         persistent_workers=args.workers > 0)
    model = SmallCNN(len(dataset.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    if args.checkpoint:
        os.makedirs(args.checkpoint, exist_ok=True)
    print(f"{len(dataset)} files, {len(dataset.classes)} classes, {len(loader)} batches of "
          f"{args.batch_size} per epoch, {args.workers} workers", flush=True)

    step, started, blocked = 0, time.perf_counter(), 0.0
    model.train()
    while step < args.steps:
        for images, labels in loader:
            images = images.permute(0, 3, 1, 2).float().sub_(mean).div_(std)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if args.checkpoint and step % args.checkpoint_every == 0:
                saving = time.perf_counter()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "step": step}, os.path.join(args.checkpoint, f"step-{step}.pt"))
                blocked += time.perf_counter() - saving
            if step >= args.steps:
                break
    wall = time.perf_counter() - started
    print(f"{step} steps, {step * args.batch_size} samples in {wall:.2f} s "
          f"({step * args.batch_size / wall:.0f} samples/s), loss {loss.item():.4f}, "
          f"blocked {blocked:.3f} s in torch.save", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
