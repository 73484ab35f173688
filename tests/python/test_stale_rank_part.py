"""A rank part left in step-N.tmp by a job that died must not be committed into a later job's
step N.

Ranks that meet through files (no torch.distributed) commit when rank 0 finds every
rank-R.json in step-N.tmp/. A Checkpointer of several ranks leaves step-N.tmp directories above
the newest committed step in place at open (another rank may be writing them), so a job that
resumes at that step number finds the dead job's parts there. Found by the sharded kill -9
rounds; expected to fail until the commit tells this job's parts from a dead one's."""

import subprocess
import sys

import numpy as np
import pytest

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


@pytest.mark.xfail(strict=True, reason="a dead job's rank-R.json in step-N.tmp/ satisfies the "
                   "file-coordinated commit of a later job's step N (see the module docstring)")
def test_a_dead_jobs_part_is_not_committed_with_a_new_jobs_step(tmp_path):
    directory = tmp_path / "ckpt"
    other = save(directory, 1, 1, 1.0, 60, background=True)  # job A: step 1, both ranks
    assert save(directory, 0, 1, 1.0, 60) == "committed"
    assert other.communicate(timeout=120)[0].strip() == "committed"
    # Job A, step 2: rank 1's part is durable, rank 0 died before its own (it never saves).
    assert save(directory, 1, 2, 2.0, 2) == "DeadlineExceededError"
    assert (directory / "step-2.tmp" / "rank-00001.json").exists()
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
