"""A rank part left in step-N.tmp by a job that died must not be committed into a later job's
step N.

Ranks that meet through files (no torch.distributed) commit when rank 0 finds every
rank-R.json in step-N.tmp/, and a step-N.tmp above the newest committed step is kept at open
(another rank may be writing it), so a job that resumes at that step number finds the dead job's
parts there. Found by the sharded kill -9 rounds. Each rank 0 publishes a fresh token in the
directory's `coordinator` file when it opens, each part carries the token its rank found there,
and rank 0 commits only parts carrying its own (docs/checkpoint.md, "Which job a part belongs
to")."""

import json
import subprocess
import sys
import time

import numpy as np

import zerowait

SAVE = r"""
import sys, numpy as np, zerowait
directory, rank, step, value, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    float(sys.argv[4]), float(sys.argv[5])
ckpt = zerowait.Checkpointer(directory, rank=rank, world_size=2, commit_timeout=timeout)
try:
    ckpt.save(step, {"x": np.full(4, value, np.float32)}, blocking=True)
    print("committed")
except zerowait.ZerowaitError as error:
    print(type(error).__name__)
"""


def save(directory, rank: int, step: int, value: float, timeout: float,
         background: bool = False):
    args = [sys.executable, "-c", SAVE, str(directory), str(rank), str(step), str(value),
            str(timeout)]
    if background:
        return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    return subprocess.run(args, capture_output=True, text=True, timeout=120).stdout.strip()


def leave_a_dead_jobs_part(directory):
    other = save(directory, 1, 1, 1.0, 60, background=True)  # job A: step 1, both ranks
    assert save(directory, 0, 1, 1.0, 60) == "committed"
    assert other.communicate(timeout=120)[0].strip() == "committed"
    # Job A, step 2: rank 1's part is durable, rank 0 died before its own (it never saves).
    assert save(directory, 1, 2, 2.0, 2) == "DeadlineExceededError"
    assert (directory / "step-2.tmp" / "rank-00001.json").exists()


def test_a_dead_jobs_part_is_not_committed_with_a_new_jobs_step(tmp_path):
    directory = tmp_path / "ckpt"
    leave_a_dead_jobs_part(directory)
    # Job B resumes after step 1 and saves step 2 with other values; its rank 1 has not
    # written anything yet (it is slow, or died).
    outcome = save(directory, 0, 2, 99.0, 3)
    steps = zerowait.Checkpointer(directory, rank=1, world_size=2).steps()
    if 2 in steps:  # then it must be job B's step 2 on every rank
        part = zerowait.Checkpointer(directory, rank=1, world_size=2).load(2, fallback=False)
        assert np.array_equal(part["x"], np.full(4, 99.0, np.float32)), (
            f"step 2 was committed ({outcome}) with job A's rank 1 part: {part['x']}")
    else:
        assert outcome == "DeadlineExceededError"


def test_a_rank_that_saves_before_its_rank_0_opens_is_committed_with_it(tmp_path):
    """The edge of the rule: job B's rank 1 finds job A's token in `coordinator` (its rank 0 has
    not opened yet) and stamps its part with it, as the dead part is stamped; once rank 0 opens,
    rank 1 re-stamps its part with the new token while it waits, and the step commits."""
    directory = tmp_path / "ckpt"
    leave_a_dead_jobs_part(directory)
    part = directory / "step-2.tmp" / "rank-00001.json"
    dead = part.read_bytes()
    dead_token = (directory / "coordinator").read_text().strip()
    rank1 = save(directory, 1, 2, 99.0, 60, background=True)
    deadline = time.monotonic() + 60
    while part.read_bytes() == dead and time.monotonic() < deadline:
        time.sleep(0.05)
    assert part.read_bytes() != dead, "job B's rank 1 never published its part"
    assert json.loads(part.read_text())["coordinator"] == dead_token
    assert save(directory, 0, 2, 99.0, 60) == "committed"
    assert rank1.communicate(timeout=120)[0].strip() == "committed"
    for rank in (0, 1):
        loaded = zerowait.Checkpointer(directory, rank=rank, world_size=2).load(2, fallback=False)
        assert np.array_equal(loaded["x"], np.full(4, 99.0, np.float32))
