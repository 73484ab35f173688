"""A Python process saving through zerowait.Checkpointer dies mid-save.

Deterministic first: the process exits at each storage operation of two saves in turn (the
$ZEROWAIT_FAULT_EXIT_AT_OPERATION fault point, as kill -9 would stop it there); afterwards every
committed step loads and verifies with exactly what it saved, and a new Checkpointer saves on.
Then, as an extra, kill -9 at random moments through the whole Python layer (torch state
flattening, the staging copy with the GIL released, asynchronous saves), with no count of kills
that must land anywhere in particular. The C++ suite does the same for every save mode
(tests/test_checkpoint.cpp).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch

import zerowait
from helpers import python_process

DIED_AT_THE_FAULT = 86  # the exit status of $ZEROWAIT_FAULT_EXIT_AT_OPERATION
HERE = Path(__file__).parent


def numpy_state(step: int) -> dict:
    """What step `step` saves, in numpy arrays."""
    return {"model": {f"layer{i}": np.arange(3000, dtype=np.float32) + step for i in range(3)},
            "frozen": np.full(5000, step // 4, dtype=np.int16),
            "step": step}


# The children are forked from the tests' zygote (helpers.python_process), torch imported
# already: about 3 s of CPU less a child than a new interpreter. Scripts, not `-c`: the zygote
# runs a file, with this folder put on the path for the state they save.
SAVE_TWO_STEPS = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import zerowait
from test_checkpoint_kill import numpy_state
with zerowait.Checkpointer(sys.argv[1], keep_last=1, incremental=True) as ckpt:
    for step in (1, 2):
        ckpt.save(step, numpy_state(step), blocking=True)
"""


def assert_every_step_holds_what_it_saved(directory: Path, when: str) -> list:
    with zerowait.Checkpointer(directory) as ckpt:
        steps = ckpt.steps()
        for step in steps:
            report = zerowait._core._ckpt_verify(str(directory), step)
            assert report["problems"] == [], (when, step, report["problems"])
            loaded, expected = ckpt.load(step, fallback=False), numpy_state(step)
            assert loaded["step"] == step, when
            assert np.array_equal(loaded["frozen"], expected["frozen"]), (when, step)
            for name, array in expected["model"].items():
                assert np.array_equal(loaded["model"][name], array), (when, step, name)
        return steps


def test_dying_at_each_storage_operation_never_leaves_a_torn_step(tmp_path):
    script = tmp_path / "save_two_steps.py"
    script.write_text(SAVE_TWO_STEPS)
    operation = 0
    while True:
        operation += 1
        directory = tmp_path / f"die-at-{operation}"
        child = python_process([str(script), str(directory)], env={
            **os.environ, "ZEROWAIT_FAULT_EXIT_AT_OPERATION": str(operation)})
        _, stderr = child.communicate(timeout=120)
        when = f"death at operation {operation}"
        if child.returncode == 0:
            break  # past the last operation of the two saves
        assert child.returncode == DIED_AT_THE_FAULT, (when, stderr)
        steps = assert_every_step_holds_what_it_saved(directory, when)
        with zerowait.Checkpointer(directory, keep_last=1, incremental=True) as ckpt:
            resumed = (steps[-1] if steps else 0) + 1
            ckpt.save(resumed, numpy_state(resumed), blocking=True)
        assert assert_every_step_holds_what_it_saved(directory, when)[-1] == resumed
    assert operation > 30, "two saves made fewer storage operations than the commit protocol has"
    assert assert_every_step_holds_what_it_saved(directory, "no death") == [2]


RANDOM_SAVER = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import torch, zerowait
from test_checkpoint_kill import torch_state
directory, mode, ready = sys.argv[1], sys.argv[2], sys.argv[3]
ckpt = zerowait.Checkpointer(directory, keep_last=3, incremental=mode == "incremental",
                             compression="zstd" if mode == "zstd" else None)
step = (ckpt.latest() or 0) + 1
open(ready, "w").close()
while True:
    ckpt.save(step, torch_state(step))  # asynchronous: waits only for the previous save
    step += 1
"""


def torch_state(step: int) -> dict:
    """What step `step` saves: half of it changes every step, half every fourth step."""
    return {
        "model": {f"layer{i}.weight": torch.arange(200_000, dtype=torch.float32) + step
                  for i in range(4)},
        "frozen": {f"embed{i}": torch.full((300_000,), float(step // 4), dtype=torch.bfloat16)
                   for i in range(4)},
        "step": step,
        "tag": f"step-{step}",
    }


def test_kill_nine_at_random_moments_never_leaves_a_torn_step(tmp_path):
    directory = tmp_path / "ckpt"
    script = tmp_path / "random_saver.py"
    script.write_text(RANDOM_SAVER)
    rng = random.Random(20261129)
    newest = 0
    for kill in range(6):
        mode = ("plain", "incremental", "zstd")[kill % 3]
        ready = tmp_path / f"ready-{kill}"
        child = python_process([str(script), str(directory), mode, str(ready)], env=os.environ)
        deadline = time.monotonic() + 60
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert ready.exists(), f"the saving child did not start: {child.communicate(5)[1]}"
        time.sleep(rng.uniform(0.0, 0.6))
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, "the child stopped by itself"

        ckpt = zerowait.Checkpointer(directory)
        steps = ckpt.steps()
        assert (steps[-1] if steps else 0) >= newest, f"kill {kill}: the newest step went back"
        newest = steps[-1] if steps else 0
        for step in steps:
            report = zerowait._core._ckpt_verify(str(directory), step)
            assert report["problems"] == [], f"kill {kill}, step {step}: {report['problems']}"
            loaded = ckpt.load(step, fallback=False)
            expected = torch_state(step)
            assert loaded["step"] == step and loaded["tag"] == expected["tag"]
            for group in ("model", "frozen"):
                for name, tensor in expected[group].items():
                    assert torch.equal(loaded[group][name], tensor), (kill, step, group, name)
        ckpt.close()
