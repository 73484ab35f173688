"""torch.distributed.checkpoint through zerowait.dcp: FSDP2 model and Adam state saved by two
ranks (dcp.save, dcp.async_save in thread and process mode) restored bit for bit onto three
ranks and onto one process; the steps listed and verified by `zerowait ckpt`; a flipped byte
named (file, tensor, chunk); a rank killed before the commit leaves no step.

The ranks are real processes (dcp_worker.py, gloo on the CPU)."""

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import zerowait
import zerowait.dcp
from zerowait import _core
from helpers import flip_byte, run_rank_reports

sys.path.insert(0, str(Path(__file__).parent))
from dcp_worker import differences, full_state, make_model  # noqa: E402

HERE = Path(__file__).parent


def run_ranks(mode: str, world_size: int, directory: Path, out: Path) -> list:
    """The worker's reports from `world_size` ranks (helpers.run_rank_reports)."""
    return run_rank_reports(HERE / "dcp_worker.py", mode, world_size, directory, out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(checkpoint directory, directory of reference-<step>.pt): steps 0-2 saved by two ranks."""
    root = tmp_path_factory.mktemp("dcp")
    reports = run_ranks("save", 2, root / "ckpt", root / "out")
    assert [r["step0"] for r in reports] == [0, 0]  # chosen by the Writer: the first step
    assert [(r["step1"], r["step2"]) for r in reports] == [("thread", "process")] * 2
    return root / "ckpt", root / "out"


def load_in_one_process(directory, step=None, **reader_options):
    """dcp.load of `step` into an unsharded model and optimizer: (full state, Reader)."""
    model, optimizer = make_model(shard=False)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "extra": {"epoch": -1}}
    reader = zerowait.dcp.Reader(directory, step, **reader_options)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, no_dist=True)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    assert state["extra"]["epoch"] == reader.loaded_step  # a bytes item, restored
    return full_state(model, optimizer), reader


def test_every_step_restores_whole_in_one_process(saved):
    directory, out = saved
    for step in range(3):
        loaded, reader = load_in_one_process(directory, step)
        assert reader.loaded_step == step
        assert differences(loaded, torch.load(out / f"reference-{step}.pt")) == [], step
    _, reader = load_in_one_process(directory)
    assert reader.loaded_step == 2  # no step given: the newest
    # An ordinary zerowait step: the Checkpointer reads its tensors whole too.
    whole = zerowait.Checkpointer(directory).load(2)
    reference = torch.load(out / "reference-2.pt")
    assert torch.equal(whole["model.0.weight"], reference["model"]["0.weight"])


def test_restore_onto_three_ranks(saved, tmp_path):
    directory, out = saved
    shutil.copy(out / "reference-2.pt", tmp_path / "reference-2.pt")
    reports = run_ranks("load", 3, directory, tmp_path)
    assert [(r["step"], r["epoch"]) for r in reports] == [(2, 2)] * 3
    assert reports[0]["differences"] == []  # rank 0 holds the full state


def test_zerowait_ckpt_lists_and_verifies_the_steps(saved, cli):
    directory, _ = saved
    listed = subprocess.run([str(cli), "ckpt", "ls", str(directory), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    steps = json.loads(listed.stdout)["steps"]
    assert [(s["step"], s["world_size"]) for s in steps] == [(0, 2), (1, 2), (2, 2)]
    verified = subprocess.run([str(cli), "ckpt", "verify", str(directory)],
                              capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "0 bad steps" in verified.stdout


def test_a_flipped_byte_is_named_and_the_mirror_copy_read(saved, tmp_path):
    directory, out = saved
    damaged = tmp_path / "damaged"
    shutil.copytree(directory, damaged)
    manifest = _core._CheckpointReader(str(damaged), 2, 1).manifest()
    piece = next(t for t in manifest["tensors"]
                 if t["name"].startswith("/model.2.weight~chunk["))
    flip_byte(damaged / piece["file"], piece["offset"] + 5)
    with pytest.raises(CheckpointException) as raised:
        load_in_one_process(damaged, 2)
    message = str(raised.value)
    assert "CorruptDataError" in message and piece["name"] in message, message
    assert Path(piece["file"]).name in message and "model.2.weight" in message
    # The same step read from a mirror that holds it intact: a warning says why.
    with pytest.warns(UserWarning, match="reading the mirror's copy"):
        loaded, _ = load_in_one_process(damaged, 2, mirror=directory)
    assert differences(loaded, torch.load(out / "reference-2.pt")) == []


def test_one_process_with_mirror_and_incremental_saves(tmp_path, cli):
    directory, mirror = tmp_path / "ckpt", tmp_path / "mirror"
    model, optimizer = make_model(shard=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        with zerowait.dcp.Writer(directory, mirror=mirror, incremental=True,
                                 keep_last=2) as writer:
            for step in (5, 6, 7):
                if step == 7:
                    model[0].bias.data += 1  # one tensor changes between steps 6 and 7
                dcp.save({"model": model.state_dict()}, storage_writer=writer,
                         checkpoint_id=step, no_dist=True)
                assert writer.saved_step == step
    for tier in (directory, mirror):
        assert zerowait.Checkpointer(tier).steps() == [6, 7]  # retention: the newest two
        verified = subprocess.run([str(cli), "ckpt", "verify", str(tier)],
                                  capture_output=True, text=True, timeout=120)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    # Step 7 wrote only the changed tensor's pieces; the rest it references in the files that
    # hold them, step 5's (retired by retention, yet kept while referenced).
    assert _core._ckpt_step_info(str(directory), 7)["references"] == [5]
    files = {t["name"]: t["file"].split("/")[0]
             for t in _core._CheckpointReader(str(directory), 7, 0).manifest()["tensors"]}
    assert {name for name, step in files.items() if step == "step-7"} == {
        name for name in files if name.startswith("/model.0.bias~")}
    loaded = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(loaded, storage_reader=zerowait.dcp.Reader(mirror / "step-7"), no_dist=True)
    assert all(torch.equal(loaded["model"][k], v) for k, v in model.state_dict().items())


def test_which_step_a_checkpoint_id_names(tmp_path):
    writer = zerowait.dcp.Writer(tmp_path / "ckpt")
    assert writer.checkpoint_id == str(tmp_path / "ckpt")  # the step is chosen at save time
    for checkpoint_id, expected in [
            (7, (str(tmp_path / "ckpt"), 7)),  # a step of the Writer's directory
            (tmp_path / "other" / "step-12", (str(tmp_path / "other"), 12)),
            ("s3://bucket/run/step-3/", ("s3://bucket/run", 3)),
            ("s3://bucket/run", ("s3://bucket/run", None)),  # a directory: step chosen
            ("s3://step-3", ("s3://step-3", None))]:  # a bucket named step-3
        writer.reset(checkpoint_id)
        assert (writer.directory, writer._step) == expected, checkpoint_id
    assert zerowait.dcp.Reader(tmp_path / "ckpt" / "step-4").checkpoint_id == str(
        tmp_path / "ckpt" / "step-4")
    with pytest.raises(ValueError, match="names step 4, but step=5"):
        zerowait.dcp.Writer(tmp_path / "step-4", step=5)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        with pytest.raises(ValueError, match=r"use_collectives=False\) is not supported"):
            dcp.save({"x": torch.ones(2)}, storage_writer=writer, no_dist=True,
                     use_collectives=False)


def test_a_step_in_an_s3_bucket(bucket, tmp_path):
    url = f"s3://{bucket}/dcp"
    model, optimizer = make_model(shard=False)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        with zerowait.dcp.Writer(url, piece_bytes=64) as writer:
            dcp.save({"model": model_sd, "optim": optim_sd, "extra": {"epoch": 0}},
                     storage_writer=writer, no_dist=True)
    assert writer.saved_step == 0 and _core._ckpt_list_steps(url) == [0]
    assert _core._ckpt_verify(url, 0)["problems"] == []
    loaded, _ = load_in_one_process(url)  # ranged reads of the pieces from the bucket
    assert differences(loaded, full_state(model, optimizer)) == []


def test_a_rank_killed_before_commit_leaves_no_step(tmp_path):
    directory = tmp_path / "ckpt"
    reports = run_ranks("kill", 2, directory, tmp_path / "out")
    assert reports[1] is None  # killed once its part of step 1 was durable
    assert reports[0]["step1"] != "committed", reports[0]
    # Both parts of step 1 are durable in step-1.tmp, but no commit record names them.
    assert (directory / "step-1.tmp" / "rank-00001.json").exists()
    assert _core._ckpt_list_steps(str(directory)) == [0]
    _, reader = load_in_one_process(directory)
    assert reader.loaded_step == 0
