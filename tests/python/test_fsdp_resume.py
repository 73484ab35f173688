"""FSDP2 training saved through zerowait, killed, and resumed on other placements.

Four ranks (real processes, gloo on the CPU) train a small transformer with fully_shard, saving
model and optimizer state every 2 steps, and die by SIGKILL in the middle of the last save
(fsdp_train_worker.py). Step 4 is then restored onto FSDP2 over 2 ranks, over 4 ranks, and onto
a 2x2 mesh (tensor parallel x fully_shard). Each restored state, gathered whole, equals the one
the 4-rank job had at step 4 bit for bit, and training goes on with the uninterrupted run's
losses: bit for bit on the saving placement; on the others to a relative 1e-5 (a few float32
ulps of a loss near 4), because a different world size or tensor parallelism sums the same
gradients and activations in another order (every step's global batch is the same).
"""

import json
import math
import signal
import sys
from pathlib import Path

import pytest
import torch

import zerowait
from zerowait import _core
from helpers import start_ranks

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_train_worker import RESUME_STEP, SAVE_EVERY, STEPS  # noqa: E402
from sharded_checkpoint_worker import equal_bits  # noqa: E402

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
LOSS_RTOL = 1e-5


def run_ranks(mode: str, world_size: int, directory: Path, out: Path) -> list:
    """Runs the worker as `world_size` processes; returns their exit statuses."""
    out.mkdir(parents=True, exist_ok=True)
    procs = start_ranks(HERE / "fsdp_train_worker.py", [mode, directory, out], world_size)
    statuses = []
    for rank, p in enumerate(procs):
        _, err = p.communicate(timeout=300)
        statuses.append(p.returncode)
        if mode != "train":
            assert p.returncode == 0, f"{mode}, rank {rank}:\n{err}"
    return statuses


def report(out: Path, name: str, rank: int = 0) -> dict:
    return json.loads((out / f"{name}-rank-{rank}.json").read_text())


def flat(value, path=""):
    """(key path, leaf) of a nested state."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flat(item, f"{path}/{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from flat(item, f"{path}/{i}")
    else:
        yield path, value


def differences(expected: dict, got: dict) -> list:
    """Key paths where two gathered states differ (any bit of a tensor, any other value)."""
    a, b = dict(flat(expected)), dict(flat(got))
    bad = sorted(set(a) ^ set(b))
    for key in set(a) & set(b):
        same = (equal_bits(a[key], b[key]) if isinstance(a[key], torch.Tensor)
                else a[key] == b[key])
        if not same:
            bad.append(key)
    return bad


def losses(out: Path, name: str) -> dict:
    """{step: loss} of rank 0's report (every rank reports the same global loss)."""
    return {int(step): loss for step, loss in report(out, name)["losses"].items()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    directory, out = root / "ckpt", root / "out"
    statuses = run_ranks("train", 4, directory, out)
    assert statuses == [-signal.SIGKILL] * 4, "every rank dies by SIGKILL, mid-save"
    return directory, out


def test_the_killed_job_left_its_committed_steps_whole(trained):
    directory, out = trained
    saved = list(range(SAVE_EVERY, STEPS, SAVE_EVERY))
    steps = zerowait.Checkpointer(directory).steps()
    # The last save was in flight at the kill: committed or not, never half.
    assert steps in (saved, saved + [STEPS]), steps
    for step in steps:
        assert _core._ckpt_verify(str(directory), step)["problems"] == [], step
    # The references differ where training changed them, so equality below means something.
    earlier = torch.load(out / f"full-step-{RESUME_STEP - SAVE_EVERY}.pt", weights_only=False)
    reference = torch.load(out / f"full-step-{RESUME_STEP}.pt", weights_only=False)
    changed = differences(earlier, reference)
    assert all(f"/model/{name}" in changed for name in reference["model"]), changed
    assert reference["optim"]["state"] and "exp_avg_sq" in next(
        iter(reference["optim"]["state"].values()))


def check_resumed(out: Path, placement: str, world: int, bitwise_losses: bool) -> None:
    name = f"{placement}-{world}"
    reference = torch.load(out / f"full-step-{RESUME_STEP}.pt", weights_only=False)
    restored = torch.load(out / f"restored-{name}.pt", weights_only=False)
    assert differences(reference, restored) == [], name
    for rank in range(world):
        assert report(out, name, rank)["loaded_step"] == RESUME_STEP
        assert report(out, name, rank)["step_value"] == RESUME_STEP
    uninterrupted = {step: loss for step, loss in losses(out, "train").items()
                     if step > RESUME_STEP}
    resumed = losses(out, name)
    assert sorted(resumed) == sorted(uninterrupted) == list(range(RESUME_STEP + 1, STEPS + 1))
    for step, loss in uninterrupted.items():
        if bitwise_losses:
            assert resumed[step] == loss, (name, step, resumed[step], loss)
        else:
            assert math.isclose(resumed[step], loss, rel_tol=LOSS_RTOL), (name, step,
                                                                          resumed[step], loss)


def test_resumed_on_two_ranks_with_fsdp2(trained, tmp_path):
    directory, out = trained
    run_ranks("resume-fsdp", 2, directory, out)
    assert report(out, "fsdp-2")["placements"] == ["Shard(dim=0)"]
    check_resumed(out, "fsdp", 2, bitwise_losses=False)


def test_resumed_on_four_ranks_with_fsdp2_and_with_tensor_parallel_x_fsdp(trained):
    directory, out = trained
    run_ranks("resume-2d", 4, directory, out)
    check_resumed(out, "fsdp", 4, bitwise_losses=True)
    two_d = report(out, "2d-4")
    # FSDP's Shard(0) over the data-parallel dimension of a tensor-parallel colwise weight.
    assert two_d["mesh"] == [2, 2] and two_d["placements"] == ["_StridedShard(dim=0, sf=2)",
                                                               "Shard(dim=0)"], two_d
    check_resumed(out, "2d", 4, bitwise_losses=False)
