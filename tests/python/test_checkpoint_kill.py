"""kill -9 of a Python process saving through zerowait.Checkpointer, at random moments.

The C++ suite kills a saving process 120 times (tests/test_checkpoint.cpp); this runs the same
check through the Python layer — state flattening, the staging copy with the GIL released,
asynchronous saves — a dozen times: afterwards every committed step loads, verifies and holds
exactly what that step saved, and the newest step never goes backwards.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import zerowait

SAVER = r"""
import sys, torch, zerowait
from test_checkpoint_kill import state_for
directory, mode = sys.argv[1], sys.argv[2]
ckpt = zerowait.Checkpointer(directory, keep_last=3, incremental=mode == "incremental",
                             compression="zstd" if mode == "zstd" else None)
step = (ckpt.latest() or 0) + 1
print("ready", flush=True)
while True:
    ckpt.save(step, state_for(step))  # asynchronous: waits only for the previous save
    step += 1
"""


def state_for(step: int) -> dict:
    """What step `step` saves: half of it changes every step, half every fourth step."""
    return {
        "model": {f"layer{i}.weight": torch.arange(200_000, dtype=torch.float32) + step
                  for i in range(4)},
        "frozen": {f"embed{i}": torch.full((300_000,), float(step // 4), dtype=torch.bfloat16)
                   for i in range(4)},
        "step": step,
        "tag": f"step-{step}",
    }


def test_kill_nine_while_saving_never_leaves_a_torn_step(tmp_path):
    directory = tmp_path / "ckpt"
    rng = random.Random(20261129)
    newest = 0
    progressed = 0
    kills = 12
    for kill in range(kills):
        mode = ("plain", "incremental", "zstd")[kill % 3]
        child = subprocess.Popen([sys.executable, "-c", SAVER, str(directory), mode],
                                 stdout=subprocess.PIPE, text=True,
                                 cwd=Path(__file__).parent)  # imports state_for from here
        assert child.stdout.readline().strip() == "ready", "the saving child did not start"
        time.sleep(rng.uniform(0.0, 0.6))
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL, "the child stopped by itself"
        child.stdout.close()

        ckpt = zerowait.Checkpointer(directory)
        steps = ckpt.steps()
        if not steps:
            continue
        assert steps[-1] >= newest, f"kill {kill}: the newest step went back"
        progressed += steps[-1] > newest
        newest = steps[-1]
        for step in steps:
            report = zerowait._core._ckpt_verify(str(directory), step)
            assert report["problems"] == [], f"kill {kill}, step {step}: {report['problems']}"
            loaded = ckpt.load(step, fallback=False)
            expected = state_for(step)
            assert loaded["step"] == step and loaded["tag"] == expected["tag"]
            for group in ("model", "frozen"):
                for name, tensor in expected[group].items():
                    assert torch.equal(loaded[group][name], tensor), (kill, step, group, name)
        ckpt.close()
    if progressed < kills // 3:
        pytest.fail(f"only {progressed} of {kills} kills found a newer committed step: the "
                    "children were killed before they could save")
