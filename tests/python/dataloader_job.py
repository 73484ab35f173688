"""A training job of the most common shape, for `zerowait watch` to be measured against: a
torch DataLoader whose workers are slow (each sample sleeps in __getitem__, as a slow disk or
decoder would), and a loop that times its own wait in next() around each step.

    python dataloader_job.py OUT.json [--steps N] [--sample-ms MS] [--compute-ms MS]
                             [--workers W] [--batch B] [--fields F]
                             [--fail-after N]

Writes OUT.json: the loop's own figures (input_s, loop_s, input_share, steps, and the
CLOCK_MONOTONIC [start, end] of each wait, in `waits`). The loop's time
starts before iter(loader) (starting the workers is input) and ends after the last step."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __init__(self, sample_ms: float, size: int, fields: int):
        self.sample_s = sample_ms / 1000
        self.size = size
        self.fields = fields

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        time.sleep(self.sample_s)
        # A small image's worth of floats per field: each field of the batch travels to the main
        # process through its own shared-memory segment and is unpickled there, as real batches
        # are; many fields make that unpickling a large part of next().
        return {f"f{k}": torch.full((3, 64, 64), float(index)) for k in range(self.fields)}


def spin(seconds: float) -> None:
    """Compute on the CPU (the main thread running in user space) for `seconds`."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sample-ms", type=float, default=10.0)
    parser.add_argument("--compute-ms", type=float, default=40.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--fields", type=int, default=1)
    parser.add_argument("--fail-after", type=int, default=-1)
    args = parser.parse_args()
    loader = DataLoader(SlowDataset(args.sample_ms, args.steps * args.batch, args.fields),
                        batch_size=args.batch, num_workers=args.workers)
    input_s = 0.0
    steps = 0
    start = time.monotonic()
    it = iter(loader)
    input_s += time.monotonic() - start
    waits = [(start, time.monotonic())]
    while True:
        before = time.monotonic()
        try:
            batch = next(it)
        except StopIteration:
            input_s += time.monotonic() - before
            break
        waits.append((before, time.monotonic()))
        input_s += waits[-1][1] - before
        if steps == args.fail_after:
            raise RuntimeError("the job failed on purpose at step %d" % steps)
        spin(args.compute_ms / 1000)
        float(batch["f0"].sum())
        steps += 1
    loop_s = time.monotonic() - start
    del it  # the workers are shut down inside the loop's time, not after it
    figures = {"input_s": input_s, "loop_s": loop_s, "input_share": input_s / loop_s,
               "steps": steps, "loop_start_monotonic": start, "waits": waits}
    with open(args.out, "w") as f:
        json.dump(figures, f)
    print("dataloader job: input %.1f %% of its loop (%d steps)" % (100 * input_s / loop_s, steps),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
