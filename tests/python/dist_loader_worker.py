"""One rank of the torch.distributed (gloo) loader test; run by test_loader.py as a real process.

Each rank iterates one epoch with rank and world size taken from torch.distributed, does an
all_reduce per batch (as DDP's gradient sync would: a rank with fewer batches would hang the
others), and writes the global indices it saw to OUT_DIR/rank-<r>.json.
"""

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import zerowait


def main() -> None:
    dataset, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    loader = zerowait.Loader(dataset, batch_size=5, seed=3, shuffle="random",
                             decode={"cls": "int"})
    seen = []
    steps = torch.zeros(1)
    for batch in loader:
        seen.extend(batch["__index__"].tolist())
        steps += 1
        dist.all_reduce(torch.ones(1))
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    result = {"rank": loader.rank, "world_size": loader.world_size, "indices": seen,
              "batches": len(loader), "max_steps": int(steps.item())}
    with open(os.path.join(out_dir, f"rank-{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
