"""zerowait.lightning.CheckpointIO under a real Lightning Trainer: ModelCheckpoint saves every N
steps with save_top_k and save_last, its removals remove zerowait steps, `zerowait ckpt verify`
passes, a new Trainer resumes (from a path and from "last") at the saved global step with the
saved weights bit for bit, a damaged step is refused, and a process that dies mid-save leaves
last.ckpt naming the previous step. examples/lightning_train.py runs as a user would run it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning", reason="the lightning package is not installed")

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import zerowait  # noqa: E402
from helpers import flip_byte  # noqa: E402
from zerowait.lightning import CheckpointIO  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning_train.py"
BATCHES_PER_EPOCH = 4
DIED_AT_THE_FAULT = 86  # the exit status of $ZEROWAIT_FAULT_EXIT_AT_OPERATION


class TinyModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.layer = torch.nn.Linear(6, 3)

    def training_step(self, batch, batch_index):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class Recorder(L.Callback):
    """The weights after each step, and the step and weights training started from."""

    def __init__(self) -> None:
        self.weights: dict[int, dict] = {}
        self.start: tuple[int, dict] | None = None

    def on_train_start(self, trainer, module) -> None:
        self.start = (trainer.global_step, copy_of(module))

    def on_train_batch_end(self, trainer, module, *args) -> None:
        self.weights[trainer.global_step] = copy_of(module)


def copy_of(module) -> dict:
    return {name: t.detach().clone() for name, t in module.state_dict().items()}


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and
        torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))
        for k in a)


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(3)
    dataset = TensorDataset(torch.randn(8 * BATCHES_PER_EPOCH, 6, generator=generator),
                            torch.randint(0, 3, (8 * BATCHES_PER_EPOCH,), generator=generator))
    return DataLoader(dataset, batch_size=8, shuffle=False)


def fit(dirpath: Path, max_steps: int, ckpt_path=None, accelerator: str = "cpu") -> Recorder:
    recorder = Recorder()
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=dirpath, every_n_train_steps=BATCHES_PER_EPOCH, save_top_k=2, monitor="step",
        mode="max", save_last=True)
    trainer = L.Trainer(max_steps=max_steps, plugins=[CheckpointIO()], accelerator=accelerator,
                        devices=1,
                        callbacks=[checkpoints, recorder], logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(TinyModel(), data(), ckpt_path=ckpt_path)
    assert trainer.global_step == max_steps
    return recorder


def pointer(path: Path) -> dict:
    return json.loads(path.read_text())


def step_folders(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.name.startswith("step-")}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, Recorder]:
    """12 steps, a checkpoint every 4 (top 2 by step, plus last.ckpt): six saves."""
    dirpath = tmp_path_factory.mktemp("lightning") / "checkpoints"
    return dirpath, fit(dirpath, 12)


def test_top_k_and_last_name_exactly_the_kept_steps_which_verify(first_run, cli):
    dirpath, _ = first_run
    names = sorted(p.name for p in dirpath.iterdir() if p.suffix == ".ckpt")
    assert names == ["epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt", "last.ckpt"]
    pointers = {name: pointer(dirpath / name) for name in names}
    assert {name: (p["global_step"], p["directory"]) for name, p in pointers.items()} == {
        "epoch=1-step=8.ckpt": (8, "zerowait"), "epoch=2-step=12.ckpt": (12, "zerowait"),
        "last.ckpt": (12, "zerowait")}
    # Six saves (each trigger saves the top-k file, then last.ckpt): steps 1..6. The step of
    # epoch=0-step=4.ckpt, which top-k removed, and those of last.ckpt's earlier versions are
    # gone, files and all: the folder holds exactly the named steps.
    named = {p["step"] for p in pointers.values()}
    assert len(named) == 3 and max(named) == 6
    store = dirpath / "zerowait"
    assert step_folders(store) == {f"step-{s}" for s in named}
    with zerowait.Checkpointer(store) as checkpointer:
        assert checkpointer.steps() == sorted(named)
    verify = subprocess.run([str(cli), "ckpt", "verify", str(store), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["ok"] and sorted(s["step"] for s in report["steps"]) == sorted(named)
    assert all(s["ok"] and s["tensors"] > 0 for s in report["steps"]), report


def test_loaded_checkpoints_hold_the_saved_weights_bit_for_bit(first_run):
    dirpath, recorder = first_run
    io = CheckpointIO()  # a fresh plugin, as a new process would have
    try:
        for name, global_step in [("epoch=1-step=8.ckpt", 8), ("epoch=2-step=12.ckpt", 12),
                                  ("last.ckpt", 12)]:
            checkpoint = io.load_checkpoint(dirpath / name)
            assert checkpoint["global_step"] == global_step, name
            assert same_bits(checkpoint["state_dict"], recorder.weights[global_step]), name
            assert checkpoint["optimizer_states"][0]["state"][0]["step"] == global_step, name
    finally:
        io.teardown()


def test_a_new_trainer_resumes_at_the_saved_step_with_the_saved_weights(first_run, tmp_path):
    dirpath, first = first_run
    resumed = fit(tmp_path / "b", 12, ckpt_path=dirpath / "epoch=1-step=8.ckpt")
    step, weights = resumed.start
    assert step == 8
    assert same_bits(weights, first.weights[8])
    # Same data, same optimizer state: the four steps after the resume retrace the first run.
    for global_step in (9, 10, 11, 12):
        assert same_bits(resumed.weights[global_step], first.weights[global_step]), global_step
    assert (tmp_path / "b" / "epoch=2-step=12.ckpt").is_file()


def test_resume_from_last_in_a_moved_folder(first_run, tmp_path):
    dirpath, first = first_run
    moved = tmp_path / "moved"
    shutil.copytree(dirpath, moved)  # pointers name their steps relative to their folder
    resumed = fit(moved, 16, ckpt_path="last")
    step, weights = resumed.start
    assert step == 12 and same_bits(weights, first.weights[12])
    # ModelCheckpoint forgets its top-k when its folder changed (Lightning warns), so it keeps
    # the first run's files beside its own (last-v1.ckpt); every name is a committed step, and
    # the steps the new run superseded are gone.
    pointers = {p.name: pointer(p) for p in moved.iterdir() if p.suffix == ".ckpt"}
    newest_last = max((p for n, p in pointers.items() if n.startswith("last")),
                      key=lambda p: p["step"])
    assert newest_last["global_step"] == 16
    assert pointers["epoch=3-step=16.ckpt"]["global_step"] == 16
    named = {p["step"] for p in pointers.values()}
    assert step_folders(moved / "zerowait") == {f"step-{s}" for s in named}
    assert max(named) == 8  # numbered on after the six steps of the first run


def test_a_damaged_step_is_refused_naming_the_file(first_run, tmp_path, cli):
    dirpath, _ = first_run
    damaged = tmp_path / "damaged"
    shutil.copytree(dirpath, damaged)
    path = damaged / "epoch=2-step=12.ckpt"
    step = pointer(path)["step"]
    tensors = damaged / "zerowait" / f"step-{step}" / "rank-00000-00000.safetensors"
    flip_byte(tensors, tensors.stat().st_size - 1)  # the last byte of the last tensor
    io = CheckpointIO()
    with pytest.raises(zerowait.CorruptDataError) as refused:
        io.load_checkpoint(path)
    message = str(refused.value)
    assert str(path) in message and f"step {step}" in message, message
    assert "rank-00000-00000.safetensors" in message, message
    with pytest.raises(zerowait.CorruptDataError):
        fit(tmp_path / "c", 16, ckpt_path=path)
    verify = subprocess.run([str(cli), "ckpt", "verify", str(damaged / "zerowait"), str(step)],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 3, verify.stdout + verify.stderr


def test_values_that_need_pickle_are_refused_unless_allowed(tmp_path):
    state = {"state_dict": {"w": torch.arange(4.0)}, "global_step": 1, "epoch": 0,
             "extra": Fraction(1, 3)}
    io = CheckpointIO()
    with pytest.raises(TypeError, match="extra.*allow_pickle=True"):
        io.save_checkpoint(state, tmp_path / "a.ckpt")
    io.teardown()
    assert not (tmp_path / "a.ckpt").exists()

    io = CheckpointIO(allow_pickle=True)
    io.save_checkpoint(state, tmp_path / "b.ckpt")
    assert io.load_checkpoint(tmp_path / "b.ckpt")["extra"] == Fraction(1, 3)  # waits for it
    with pytest.raises(ValueError, match="pickled"):
        io.load_checkpoint(tmp_path / "b.ckpt", weights_only=True)
    io.teardown()
    assert CheckpointIO().load_checkpoint(tmp_path / "b.ckpt", weights_only=False)["extra"] == \
        Fraction(1, 3)


def test_files_that_are_not_pointers(tmp_path):
    io = CheckpointIO()
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "missing.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "torch.ckpt")
    with pytest.raises(ValueError, match="not a checkpoint of zerowait.lightning"):
        io.load_checkpoint(tmp_path / "torch.ckpt")
    io.remove_checkpoint(tmp_path / "torch.ckpt")  # Lightning's file to remove: removed
    assert not (tmp_path / "torch.ckpt").exists()
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, tmp_path / "gone.ckpt")
    io.teardown()
    shutil.rmtree(tmp_path / "zerowait" / f"step-{pointer(tmp_path / 'gone.ckpt')['step']}")
    with pytest.raises(FileNotFoundError, match="gone.ckpt names step .* which is not there"):
        io.load_checkpoint(tmp_path / "gone.ckpt")
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"a": 1})
    with pytest.raises(ValueError, match="local filesystem"):
        CheckpointIO("s3://bucket/ckpt")


SAVE_LAST = r"""
import sys, torch
from zerowait.lightning import CheckpointIO
io = CheckpointIO()
io.save_checkpoint({"state_dict": {"w": torch.full((256,), 2.0)}, "global_step": 2}, sys.argv[1])
io.teardown()
"""


def test_dying_after_the_commit_leaves_last_naming_the_previous_step(tmp_path):
    first = {"state_dict": {"w": torch.full((256,), 1.0)}, "global_step": 1}
    io = CheckpointIO()
    io.save_checkpoint(first, tmp_path / "last.ckpt")
    io.teardown()
    # The second save's storage operation 21 comes after its commit (the rename of step-2.tmp,
    # docs/checkpoint.md "The commit protocol"): the step is whole, its pointer not yet written.
    # (A death before the commit leaves no step-2 at all: tests/python/test_checkpoint_kill.py.)
    child = subprocess.run([sys.executable, "-c", SAVE_LAST, str(tmp_path / "last.ckpt")],
                           env={**os.environ, "ZEROWAIT_FAULT_EXIT_AT_OPERATION": "21"},
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == DIED_AT_THE_FAULT, child.stderr
    assert step_folders(tmp_path / "zerowait") == {"step-1", "step-2"}, \
        "the death was meant to come after step 2's commit"
    # last.ckpt still names step 1, which loads whole.
    assert pointer(tmp_path / "last.ckpt")["step"] == 1
    loaded = CheckpointIO().load_checkpoint(tmp_path / "last.ckpt")
    assert torch.equal(loaded["state_dict"]["w"], first["state_dict"]["w"])


@pytest.mark.gpu
def test_a_cuda_state_saves_and_resumes_on_the_gpu(tmp_path):
    # Lightning hands the plugin the model and optimizer state on the GPU: the Checkpointer
    # copies it through its staging pool on a copy stream, and a resume loads it back to the
    # device each tensor came from.
    first = fit(tmp_path / "a", 8, accelerator="gpu")
    checkpoint = CheckpointIO().load_checkpoint(tmp_path / "a" / "epoch=1-step=8.ckpt")
    assert all(t.is_cuda for t in checkpoint["state_dict"].values())
    assert same_bits(checkpoint["state_dict"], first.weights[8])
    resumed = fit(tmp_path / "b", 12, ckpt_path=tmp_path / "a" / "last.ckpt", accelerator="gpu")
    step, weights = resumed.start
    assert step == 8 and same_bits(weights, first.weights[8])


def run_example(dirpath: Path, *extra: str) -> str:
    result = subprocess.run([sys.executable, str(EXAMPLE), "--dir", str(dirpath), *extra],
                            capture_output=True, text=True, timeout=180,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_example_trains_resumes_and_verifies(tmp_path):
    out = run_example(tmp_path, "--max-steps", "8")
    assert "started at global step 0" in out and "finished at global step 8" in out, out
    out = run_example(tmp_path, "--max-steps", "12", "--resume")
    assert "started at global step 8" in out and "finished at global step 12" in out, out
    assert "verified" in out, out
    assert os.path.islink(tmp_path / "last.ckpt")  # save_last="link": no second save
