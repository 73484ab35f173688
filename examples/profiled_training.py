#!/usr/bin/env python3
"""Where a training step's seconds go, and what the waiting costs: ``zerowait.StepProfiler``.

    python examples/profiled_training.py --out runs/profiled
    python examples/profiled_training.py --input-delay 0 --out runs/fixed   # the input fixed
    zerowait report runs/profiled                                          # the HTML page

A small classifier trains on the CPU over a generated zerowait dataset, with two delays planted
so that the profiler has something to find:

- input: the Loader's ``map=`` function sleeps ``--input-delay`` seconds per batch (with
  ``map_workers=0`` it runs in the training thread, inside ``next()``: the loop waits for it,
  as it would for a slow disk);
- checkpoint: every ``--checkpoint-every`` steps a ``--checkpoint-mb`` MiB state is saved with
  ``blocking=True`` (written and fsynced before the loop goes on, as ``torch.save`` would).

The profiler attributes each step's wall time to input, checkpoint, h2d, communication, compute
and other, and prices the waits for ``--gpus`` GPUs at ``--gpu-hourly-cost`` dollars an hour. The
run prints the planted shares next to the measured ones, the profiler's table, and writes the
run directory (run.json, steps.jsonl, system.jsonl) to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerowait

FEATURES, CLASSES = 64, 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="run directory to write (default: none)")
    p.add_argument("--data", default=None,
                   help="dataset directory; generated there when missing (default: a temporary "
                        "one)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--input-delay", type=float, default=0.03,
                   help="seconds the map= function sleeps per batch")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--checkpoint-mb", type=int, default=8, help="MiB of state each save writes")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--gpu-hourly-cost", type=float, default=2.0, help="dollars per GPU hour")
    p.add_argument("--metrics", default=None,
                   help="write the loader's, checkpointer's and steps' metrics here at the end "
                        "(FILE.prom, for node_exporter's textfile collector; docs/metrics.md)")
    return p.parse_args(argv)


def generate(path: str, samples: int) -> None:
    """Feature vectors whose label is the argmax of a fixed projection: learnable."""
    rng = np.random.default_rng(0)
    projection = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    rows = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    labels = (rows @ projection).argmax(axis=1)
    zerowait.write_dataset(({"x": row.tobytes(), "cls": str(label).encode()}
                            for row, label in zip(rows, labels)), path)


class SlowDecode:
    """The map= function: bytes to a float32 vector and an int label, plus a planted sleep once
    per batch (one long sleep rather than many short ones, whose wake-ups would add input wait
    of their own), whose real length is kept: the planted input wait."""

    def __init__(self, per_batch_s: float, batch_size: int) -> None:
        self.per_batch_s = per_batch_s
        self.batch_size = batch_size
        self.calls = 0
        self.slept = 0.0

    def __call__(self, sample: dict) -> dict:
        self.calls += 1
        if self.per_batch_s > 0 and self.calls % self.batch_size == 1 % self.batch_size:
            started = time.monotonic()
            time.sleep(self.per_batch_s)
            self.slept += time.monotonic() - started
        return {"x": np.frombuffer(sample["x"], dtype=np.float32),
                "y": int(bytes(sample["cls"]))}


def train(args: argparse.Namespace, data: str) -> int:
    torch.manual_seed(0)
    # A model this small gains nothing from more threads, and on a busy machine torch's
    # spinning intra-op threads would turn a 1 ms step into 100 ms of "compute".
    torch.set_num_threads(1)
    decode = SlowDecode(args.input_delay, args.batch_size)
    model = nn.Sequential(nn.Linear(FEATURES, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    padding = torch.zeros(args.checkpoint_mb << 18)  # float32: MiB of state beside the model
    planted_checkpoint_s = 0.0
    with tempfile.TemporaryDirectory(prefix="zerowait-ckpt-") as ckpt_dir, \
            zerowait.Loader(data, batch_size=args.batch_size, shuffle=True, threads=1,
                            map=decode, map_workers=0) as loader, \
            zerowait.Checkpointer(ckpt_dir, keep_last=1) as ckpt:
        prof = zerowait.StepProfiler(loader, ckpt, out=args.out, gpus=args.gpus,
                                     gpu_hourly_cost=args.gpu_hourly_cost,
                                     title="profiled_training.py: planted input and checkpoint "
                                           "delays")
        with prof:  # saves the run directory to --out at the end
            batches = iter(loader)
            for step in range(1, args.steps + 1):
                with prof.step(samples=args.batch_size, bytes=args.batch_size * FEATURES * 4):
                    batch = next(batches, None)
                    if batch is None:  # next epoch
                        batches = iter(loader)
                        batch = next(batches)
                    loss = F.cross_entropy(model(batch["x"]), batch["y"])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    if step % args.checkpoint_every == 0:
                        started = time.monotonic()
                        ckpt.save(step, {"model": model.state_dict(), "padding": padding},
                                  blocking=True)
                        planted_checkpoint_s += time.monotonic() - started
        summary = prof.summary()
        wall = summary["duration_s"]
        print(f"final loss {loss.item():.3f}")
        # The measured input share also holds the loader's own work beside the planted sleep
        # (running map= per sample, stacking the batch).
        print(f"planted input wait:   {100 * decode.slept / wall:5.1f} % of wall, measured "
              f"{100 * summary['shares']['input']:5.1f} %")
        print(f"planted checkpoint:   {100 * planted_checkpoint_s / wall:5.1f} % of wall, "
              f"measured {100 * summary['shares']['checkpoint']:5.1f} %")
        print()
        print(prof.report(), end="")
        if args.metrics:
            zerowait.metrics.write_textfile(args.metrics, loader=loader, checkpointer=ckpt,
                                            profiler=prof)
            print(f"metrics: {args.metrics}")
    if args.out:
        print(f"run directory: {args.out} (zerowait report {args.out})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.data is not None:
        if not os.path.exists(args.data):
            generate(args.data, 4096)
        return train(args, args.data)
    with tempfile.TemporaryDirectory(prefix="zerowait-data-") as data:
        generate(data, 4096)
        return train(args, data)


if __name__ == "__main__":
    sys.exit(main())
