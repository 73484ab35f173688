"""examples/train.py run as a user would run it: a real process on a small packed ImageFolder.

An uninterrupted run and a run stopped mid-epoch after a checkpoint, then resumed, must see the
same batches in the same order (none skipped, none repeated) and end with the same weights.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zerowait

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"

SAMPLES, BATCH = 120, 8
STEPS_PER_EPOCH = SAMPLES // BATCH  # 15
# "GPU input stall" on a CUDA device; these runs train on the CPU, where it is "input stall".
EPOCH_LINE = re.compile(r"^epoch (\d+): step (\d+), .* loss (\S+), input stall: (\S+) %",
                        re.MULTILINE)
SAVES_LINE = re.compile(r"^checkpoints: (\d+) saves, blocked \d+\.\d{3} s in total$", re.MULTILINE)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train-example")
    zerowait.generate_imagefolder(root / "tree", files=SAMPLES, classes=4, seed=3,
                                  min_bytes=1500, max_bytes=5000)
    zerowait.pack(root / "tree", root / "shards", imagefolder=True, sync=False)
    return root / "shards"


def run_train(dataset: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(TRAIN), "--data", str(dataset), "--epochs", "2",
               "--batch-size", str(BATCH), "--image-size", "32", "--threads", "2", "--seed", "5",
               *extra]
    # One intra-op thread: for 32x32 batches of 8 more threads only contend with the loader's.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def train(dataset: Path, cwd: Path, *extra: str) -> str:
    result = run_train(dataset, cwd, *extra)
    assert result.returncode == 0, f"{' '.join(result.args)}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def read_indices(path: Path) -> list[list[int]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def epoch_lines(stdout: str) -> list[tuple[int, int, float, float]]:
    return [(int(e), int(s), float(loss), float(stall))
            for e, s, loss, stall in EPOCH_LINE.findall(stdout)]


def test_resume_mid_epoch_continues_exactly(dataset, tmp_path):
    # (a) Two epochs without a break.
    out = train(dataset, tmp_path, "--log-indices", "a.jsonl", "--checkpoint", "a",
                "--checkpoint-every", "1000")
    full = read_indices(tmp_path / "a.jsonl")
    assert len(full) == 2 * STEPS_PER_EPOCH
    for epoch in range(2):
        seen = sum(full[epoch * STEPS_PER_EPOCH:(epoch + 1) * STEPS_PER_EPOCH], [])
        assert sorted(seen) == list(range(SAMPLES)), f"epoch {epoch} is not a permutation"
    assert full[:STEPS_PER_EPOCH] != full[STEPS_PER_EPOCH:], "both epochs in the same order"
    lines = epoch_lines(out)
    assert [(e, s) for e, s, _, _ in lines] == [(0, 15), (1, 30)], out
    assert all(math.isfinite(loss) and 0 <= stall <= 100 for _, _, loss, stall in lines), out
    assert "GPU" not in out, out  # no GPU took part in this run
    assert SAVES_LINE.search(out).group(1) == "1", out  # only the final save

    # (b) Stopped at step 20 (5 batches into epoch 1) right after a checkpoint, then resumed.
    k = STEPS_PER_EPOCH + 5
    out = train(dataset, tmp_path, "--log-indices", "b.jsonl", "--checkpoint", "b",
                "--checkpoint-every", "10", "--steps", str(k))
    assert len(read_indices(tmp_path / "b.jsonl")) == k
    assert [(e, s) for e, s, _, _ in epoch_lines(out)] == [(0, 15), (1, k)], out
    assert SAVES_LINE.search(out).group(1) == "2", out  # steps 10 and 20; no extra final save
    assert zerowait.Checkpointer(tmp_path / "b").steps() == [10, k]
    assert zerowait.Checkpointer(tmp_path / "b").load()["step"] == k

    out = train(dataset, tmp_path, "--log-indices", "b.jsonl", "--checkpoint", "b",
                "--checkpoint-every", "10", "--resume")
    assert f"resumed from b at step {k} (epoch 1, 10 of 15 batches left in it)" in out, out
    lines = epoch_lines(out)
    assert [(e, s) for e, s, _, _ in lines] == [(1, 30)], out
    assert math.isfinite(lines[0][2]), out
    assert read_indices(tmp_path / "b.jsonl") == full

    # Same batches, same augmentations, same optimizer state: the same weights at the end.
    checkpoint_a, checkpoint_b = (zerowait.Checkpointer(tmp_path / d) for d in "ab")
    a, b = checkpoint_a.load(), checkpoint_b.load()
    assert checkpoint_a.loaded_step == checkpoint_b.loaded_step == 2 * STEPS_PER_EPOCH
    assert checkpoint_b.steps() == [k, 2 * STEPS_PER_EPOCH]  # keep_last=2
    assert a["step"] == b["step"] == 2 * STEPS_PER_EPOCH
    assert a["loader"] == b["loader"]
    for name, tensor in a["model"].items():
        assert torch.allclose(tensor.float(), b["model"][name].float(), rtol=1e-4, atol=1e-5), name

    # A fresh run does not write over an earlier run's steps: it refuses before training.
    refused = run_train(dataset, tmp_path, "--checkpoint", "b")
    assert refused.returncode != 0 and "pass --resume" in refused.stderr, refused.stderr
    assert checkpoint_b.steps() == [k, 2 * STEPS_PER_EPOCH]


def test_profiled_training_finds_its_planted_delays(tmp_path, ground_truth):
    script = TRAIN.with_name("profiled_training.py")
    # Input is planted as the bigger wait by a margin that holds on a busy machine: 40 sleeps of
    # 80 ms (at least 3.2 s) against two blocking saves (0.3-0.9 s each measured at load 20).
    # With the example's defaults the two are about equal, and which one a run calls the verdict
    # depends on the disk and the load.
    result = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "run"),
                             "--input-delay", "0.08", "--checkpoint-every", "20"],
                            cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    shares = {cause: (float(planted), float(measured)) for cause, planted, measured in re.findall(
        r"^planted (input|checkpoint)\D+([\d.]+) % of wall, measured +([\d.]+) %$",
        result.stdout, re.MULTILINE)}
    assert set(shares) == {"input", "checkpoint"}, result.stdout
    # Points of share each may be off; measured input also holds the loader's own per-sample
    # work beside the planted sleep, so it may read more.
    checkpoint_points, (input_below, input_above) = 5, (1, 10)
    ground_truth("examples/profiled_training.py: checkpoint share, %",
                 *shares["checkpoint"], within=checkpoint_points)
    ground_truth("examples/profiled_training.py: input share, % (the loader's own work is "
                 "input too)", *shares["input"], within=(input_below, input_above))
    assert abs(shares["checkpoint"][1] - shares["checkpoint"][0]) <= checkpoint_points, (
        result.stdout)
    assert -input_below <= shares["input"][1] - shares["input"][0] <= input_above, result.stdout
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["verdict"] == "input-bound" and run["cost"]["gpus"] == 8, run
    money = re.search(r"^input wait costs \$([\d,.]+)/day, \$[\d,.]+/year on 8 GPUs at \$2\.00/h$",
                      result.stdout, re.MULTILINE)
    assert money, result.stdout
    per_day = run["shares"]["input"] * 8 * 2.0 * 24
    assert float(money.group(1).replace(",", "")) == pytest.approx(per_day, abs=0.006)
    assert len((tmp_path / "run" / "steps.jsonl").read_text().splitlines()) == 40
