"""How long Lightning's training loop is blocked in a checkpoint save: zerowait.lightning's
CheckpointIO against Lightning's own TorchCheckpointIO and AsyncCheckpointIO(TorchCheckpointIO),
on the same state, the same filesystem (--out), in one run.

Each plugin saves a state of --mb MB (32 fp32 tensors) --saves times, the tensors changed in
place before each save (the optimizer step) and --gap seconds of "training" after it, then
teardown() (Lightning's end of fit: every save on disk). The first save of each plugin is shown
apart: it pre-faults zerowait's staging pool; later saves reuse it. AsyncCheckpointIO clones
every tensor into new memory on each save, which this machine pays in first-touch page faults
(docs: DESIGN, about 0.3 GB/s); zerowait copies into the already-touched pool.

Usage: .venv/bin/python bench/lightning_checkpoint.py [--mb 128] [--saves 4] [--gap 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO

from zerowait.lightning import CheckpointIO


def measure(io, folder: str, state: dict, saves: int, gap: float) -> dict:
    blocked = []
    started = time.monotonic()
    for k in range(saves):
        for tensor in state["state_dict"].values():
            tensor.add_(1.0)
        t0 = time.monotonic()
        io.save_checkpoint(state, os.path.join(folder, f"step={k}.ckpt"))
        blocked.append(time.monotonic() - t0)
        time.sleep(gap)
    io.teardown()
    later = blocked[1:] or blocked
    return {"first": blocked[0], "later": sum(later) / len(later),
            "total": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=128, help="state size in MB")
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--gap", type=float, default=1.0, help="seconds of training per save")
    parser.add_argument("--out", default=None, help="folder on the filesystem to measure")
    args = parser.parse_args()

    elements = args.mb * 1024 * 1024 // 4 // 32
    state = {"state_dict": {f"layer{i}.weight": torch.randn(elements) for i in range(32)},
             "global_step": 0, "epoch": 0}
    root = tempfile.mkdtemp(prefix="zw-lightning-bench-", dir=args.out)
    try:
        plugins = [("zerowait.lightning.CheckpointIO", CheckpointIO()),
                   ("TorchCheckpointIO", TorchCheckpointIO()),
                   ("AsyncCheckpointIO(TorchCheckpointIO)", AsyncCheckpointIO(TorchCheckpointIO()))]
        rows = [(name, measure(io, os.path.join(root, str(i)), state, args.saves, args.gap))
                for i, (name, io) in enumerate(plugins)]
    finally:
        shutil.rmtree(root, ignore_errors=True)

    reference = rows[1][1]["later"]
    print(f"state {args.mb} MB, {args.saves} saves, {args.gap:g} s of training after each; "
          f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}")
    print(f"{'plugin':38s} {'blocked per save':>17s} {'vs torch':>9s} {'first save':>11s} "
          f"{'run + teardown':>15s}")
    for name, r in rows:
        print(f"{name:38s} {r['later']:16.3f}s {r['later'] / reference:8.2f}x "
              f"{r['first']:10.3f}s {r['total']:14.1f}s")
    print("blocked per save: the mean over saves 2..N (the first is shown apart)")


if __name__ == "__main__":
    main()
