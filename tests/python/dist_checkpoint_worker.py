"""One rank of the multi-process checkpoint tests; run by test_checkpoint.py as a real process.

    dist_checkpoint_worker.py MODE DIRECTORY OUT_DIR      (RANK, WORLD_SIZE, MASTER_* in env)

MODE "gloo": torch.distributed (gloo) is initialised and coordinates the commit; "files": no
process group, ranks meet through files. Either way every rank saves its own state as steps 1
and 2 and loads it back; with gloo, rank 1 then damages its part of step 2 and every rank's
load() must agree on step 1. MODE "gloo-die": rank 1 exits (os._exit) right after starting step 2's
save; the others report what their saves of steps 2 and 3 raised. Each rank writes what it saw to
OUT_DIR/rank-<r>.json (rank 1 of "gloo-die" before it exits).
"""

import json
import os
import sys
import warnings
from datetime import timedelta

import numpy as np
import torch

import zerowait
from helpers import flip_byte


def rank_state(rank: int, step: int) -> dict:
    """What `rank` saves at `step`: different on every rank and step."""
    return {"rank": rank, "step": step,
            "model": {"w": torch.full((64, 64), float(rank * 100 + step)),
                      "b": torch.arange(8) * (rank + 1)},
            "optimizer": {"state": {0: {"exp_avg": torch.full((64, 64), float(-step))}}},
            "ids": np.arange(10) + rank}


def same(a, b) -> bool:
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def corrupt_tensor(directory, step: int, name: str = "", rank: int = 0) -> str:
    """Flips a byte in the middle of tensor `name`'s stored bytes (default: the first tensor of
    the part) in `rank`'s part of `step`; returns the file's path relative to `directory`."""
    tensors = zerowait._core._CheckpointReader(str(directory), step, rank).manifest()["tensors"]
    stored = next(t for t in tensors if t["name"] == name or not name)
    flip_byte(os.path.join(directory, stored["file"]), stored["offset"] + stored["stored_bytes"] // 2)
    return stored["file"]


def outcome(handle) -> str:
    try:
        handle.wait()
        return "committed"
    except zerowait.ZerowaitError as error:
        return f"{type(error).__name__}: {error}"


def main() -> None:
    mode, directory, out_dir = sys.argv[1:4]
    rank = int(os.environ["RANK"])
    report = {"rank": rank, "coordinated_by": "files" if mode == "files" else "gloo"}

    def write_report() -> None:
        with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
            json.dump(report, f)

    if mode != "files":
        dist = torch.distributed
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    ckpt = zerowait.Checkpointer(directory, commit_timeout=30)
    assert (ckpt.rank, ckpt.world_size) == (rank, int(os.environ["WORLD_SIZE"]))

    if mode in ("gloo", "files"):
        report["committed"] = [ckpt.save(step, rank_state(rank, step), blocking=True).wait()
                               ["committed"] for step in (1, 2)]
        ckpt.wait()
        report["steps"] = ckpt.steps()
        assert same(ckpt.load(), rank_state(rank, 2))
        assert same(ckpt.load(1), rank_state(rank, 1))
        if mode == "gloo":
            # Rank 1's part of step 2 goes bad: every rank must resume from step 1.
            if rank == 1:
                corrupt_tensor(directory, 2, rank=rank)
            dist.barrier()
            with warnings.catch_warnings(record=True) as warned:
                warnings.simplefilter("always")
                assert same(ckpt.load(), rank_state(rank, 1))
            report["after_damage"] = {"loaded_step": ckpt.loaded_step,
                                      "warnings": [str(w.message) for w in warned]}
        ckpt.close()
        write_report()
        if mode == "gloo":
            dist.destroy_process_group()
        return

    assert mode == "gloo-die"
    report["step_1"] = outcome(ckpt.save(1, rank_state(rank, 1), blocking=False))
    handle = ckpt.save(2, rank_state(rank, 2))
    if rank == 1:
        report["exits"] = True
        write_report()
        os._exit(3)  # mid-save: the writer thread dies with the process
    report["step_2"] = outcome(handle)
    report["step_3"] = outcome(ckpt.save(3, rank_state(rank, 3)))
    report["steps_after"] = ckpt.steps()
    try:
        ckpt.close()
    except zerowait.ZerowaitError:
        pass  # the step 2/3 errors once more: reported above
    write_report()
    # The default group has lost a rank: tearing it down could wait for it.
    os._exit(0)


if __name__ == "__main__":
    main()
