#!/usr/bin/env python3
"""Train a small image classifier on a zerowait dataset: a complete loop to copy from.

    python examples/train.py --data /fast/train                    # a packed ImageFolder
    python examples/train.py --data demo-shards --epochs 2         # generated if missing
    python examples/train.py --data demo-shards --checkpoint ckpt/ --resume
    torchrun --nproc-per-node 2 examples/train.py --data demo-shards   # DDP, CPU (gloo) or GPU

What it shows:

- ``zerowait.Loader`` in place of ``DataLoader``: decoding, RandomResizedCrop and flip run on
  C++ threads; each batch arrives as uint8 [B, H, W, 3] plus int64 labels.
- Normalisation on the tensor, on the training device (``to_input``), not per image.
- Rank and world size: the Loader reads them from torch.distributed / RANK / WORLD_SIZE itself.
- Checkpoints that hold the loader's position, so ``--resume`` continues mid-epoch with exactly
  the batches an uninterrupted run would have seen next (same samples, same augmentations).
- ``zerowait.Checkpointer`` in place of ``torch.save``: ``save()`` returns once the state is
  copied and the files are written and committed in the background, so the loop barely waits;
  every rank saves its own part (its loader position differs) into the same step. The last
  line says how long the loop was blocked in ``save()`` in total.
- A per-epoch line with samples/s, loss and the input stall: the share of the epoch the
  training loop spent waiting for the loader.

When ``--data`` does not exist, a small synthetic ImageFolder is generated and packed there
first. Its labels are random with respect to the pixels, so the loss stays near ln(classes):
it exercises the pipeline, not learning. Pack real data with
``zerowait pack ~/data/train -o /fast/train --imagefolder``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import zerowait
from small_cnn import SmallCNN  # beside this file

# torchvision's ImageNet statistics, on the 0..255 scale of the loader's uint8 pixels.
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True,
                   help="packed dataset (directory, manifest.json, .zws or .tar); "
                        "generated and packed here when it does not exist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--steps", type=int, default=0,
                   help="stop after this many optimizer steps in total (0: run every epoch)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="loader threads (0: one per CPU but one)")
    p.add_argument("--seed", type=int, default=0, help="sample order, augmentation and init")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--checkpoint", default=None,
                   help="checkpoint directory (e.g. ckpt/), kept by zerowait.Checkpointer: the "
                        "newest two steps stay")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest step in --checkpoint when there is one (else "
                        "start fresh)")
    p.add_argument("--log-indices", default=None,
                   help="append each batch's sample indices to this file, one JSON list a line "
                        "(FILE.rankN per rank when distributed)")
    p.add_argument("--synthetic-files", type=int, default=2000,
                   help="images to generate when --data does not exist")
    p.add_argument("--synthetic-classes", type=int, default=10)
    return p.parse_args(argv)


def ensure_dataset(path: str, files: int, classes: int, seed: int) -> None:
    """Packs a synthetic ImageFolder into ``path`` unless something is there already."""
    if os.path.exists(path):
        return
    print(f"{path} does not exist: generating a synthetic ImageFolder of {files} JPEGs in "
          f"{classes} classes and packing it there", flush=True)
    with tempfile.TemporaryDirectory(prefix="zerowait-tree-") as tree:
        zerowait.generate_imagefolder(tree, files=files, classes=classes, seed=seed,
                                      min_bytes=4000, max_bytes=16000)
        report = zerowait.pack(tree, path, imagefolder=True)
    print(f"packed {report['samples']} samples into {report['shards']} shard(s) in "
          f"{report['seconds']:.1f} s", flush=True)


def to_input(batch: dict, device: torch.device, mean: torch.Tensor, std: torch.Tensor):
    """uint8 [B, H, W, 3] -> normalised float [B, 3, H, W] on ``device``; labels int64 [B].

    Move the uint8 tensor first (4x fewer bytes than float), then convert and normalise there.
    With a CUDA device the Loader has already copied the batch (see main), so ``.to`` is a
    no-op; on the CPU it is one too. The permute is a view: the result is channels-last in
    memory, which convolutions accept as is.
    """
    images = batch["jpg"].to(device, non_blocking=True)
    labels = batch["cls"].to(device, non_blocking=True)
    images = images.permute(0, 3, 1, 2).float().sub_(mean).div_(std)
    return images, labels


def save_checkpoint(ckpt: zerowait.Checkpointer, model: nn.Module,
                    optimizer: torch.optim.Optimizer, loader: zerowait.Loader, step: int) -> float:
    """Saves the training state as step ``step`` and returns the seconds the loop was blocked:
    the copy of the state, plus waiting for the previous save if it is still being written.
    Files, fsync and commit go on in the background; a crash mid-save leaves the previous step
    the newest."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "loader": loader.state_dict(), "step": step}
    started = time.perf_counter()
    ckpt.save(step, state)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:  # started by torchrun: one process per rank
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
        if args.device.startswith("cuda"):  # one GPU per process
            args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
            torch.cuda.set_device(args.device)
    rank = dist.get_rank() if distributed else 0
    if rank == 0:
        ensure_dataset(args.data, args.synthetic_files, args.synthetic_classes, args.seed)
    if distributed:
        dist.barrier()  # the other ranks wait for rank 0 to pack the synthetic data

    # Every rank saves its own part of each step (its loader position differs). Under torchrun
    # every rank must create the Checkpointer, after init_process_group: the ranks agree on each
    # commit over a process group it creates.
    ckpt = zerowait.Checkpointer(args.checkpoint, keep_last=2) if args.checkpoint else None
    if ckpt is not None and not args.resume and ckpt.latest() is not None:
        # A committed step is never overwritten, and a fresh run's steps among an earlier run's
        # would make a later --resume continue the wrong one.
        sys.exit(f"{args.checkpoint} holds steps {ckpt.steps()} of an earlier run: pass --resume "
                 f"to continue it, or another directory to start over")

    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    dataset = zerowait.Dataset(args.data)
    classes = dataset.classes
    if not classes:
        sys.exit(f"{args.data} has no class list: pack an ImageFolder with --imagefolder")

    # The loader. rank / world_size are left out: it takes them from torch.distributed (or
    # RANK / WORLD_SIZE) and gives every rank a disjoint share with the same number of batches.
    # With a CUDA device it copies each batch there itself, on a side stream, out of
    # page-locked buffers that it keeps alive until the copy has finished.
    loader = zerowait.Loader(
        args.data,
        batch_size=args.batch_size,
        seed=args.seed,
        threads=args.threads,
        decode={"jpg": zerowait.RandomResizedCrop(args.image_size, flip=True), "cls": "int"},
        device=args.device if device.type == "cuda" else "cpu",
    )

    model = SmallCNN(len(classes)).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    module = model.module if distributed else model  # what the checkpoint holds
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    step = 0
    if args.resume and ckpt is not None and ckpt.latest() is not None:
        state = ckpt.load(map_location=device)  # the newest step that reads back intact
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # the next batch is the one after the saved step
        step = state["step"]
        if rank == 0:
            print(f"resumed from {args.checkpoint} at step {ckpt.loaded_step} "
                  f"(epoch {loader.epoch}, {loader.remaining()} of {len(loader)} batches left "
                  f"in it)", flush=True)
    elif args.resume and rank == 0:
        print(f"no checkpoint at {args.checkpoint}: starting from scratch", flush=True)
    if rank == 0:
        print(f"{len(dataset)} samples, {len(classes)} classes, "
              f"rank {loader.rank} of {loader.world_size}, {len(loader)} batches of "
              f"{args.batch_size} per epoch, device {device}", flush=True)

    index_log = None
    if args.log_indices:  # one file per rank when there are several
        suffix = f".rank{loader.rank}" if loader.world_size > 1 else ""
        index_log = open(args.log_indices + suffix, "a")
    saved_at = step
    saves, blocked = 0, 0.0  # checkpoints saved by this run, seconds the loop waited in save()
    model.train()
    stop = bool(args.steps) and step >= args.steps  # resumed at --steps already: nothing to do
    while loader.epoch < args.epochs and not stop:
        epoch = loader.epoch
        started = time.perf_counter()
        waited = loader.stats()["wait_s"]
        loss_sum = torch.zeros((), device=device)
        samples = batches = 0
        for batch in loader:  # runs the rest of the current epoch, then stands at the next
            images, labels = to_input(batch, device, mean, std)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            batches += 1
            samples += labels.numel()
            loss_sum += loss.detach()  # no .item() per step: that would wait for the device
            if index_log is not None:
                index_log.write(json.dumps(batch["__index__"].tolist()) + "\n")
                index_log.flush()
            if ckpt is not None and step % args.checkpoint_every == 0:
                blocked += save_checkpoint(ckpt, module, optimizer, loader, step)
                saves += 1
                saved_at = step
            if args.steps and step >= args.steps:
                stop = True
                break
        if batches == 0:
            continue
        wall = time.perf_counter() - started
        stall = loader.stats()["wait_s"] - waited
        loss = loss_sum.item() / batches
        if rank == 0:
            # "GPU" only where a GPU waited: on the CPU it is the training loop that waits.
            stalled = "GPU input stall" if device.type == "cuda" else "input stall"
            print(f"epoch {epoch}: step {step}, {samples} samples in {wall:.2f} s "
                  f"({samples / wall:.0f} samples/s per rank), loss {loss:.4f}, "
                  f"{stalled}: {100 * stall / wall:.1f} % ({stall:.2f} s)", flush=True)
    if ckpt is not None:
        if saved_at != step:
            blocked += save_checkpoint(ckpt, module, optimizer, loader, step)
            saves += 1
        # Before exit and before destroy_process_group: every save committed (raises if one
        # failed), and the Checkpointer's commit thread stopped.
        ckpt.close()
        if rank == 0:
            print(f"checkpoints: {saves} saves, blocked {blocked:.3f} s in total", flush=True)
    if index_log is not None:
        index_log.close()
    loader.close()
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
