"""Sharded state (DTensor) in checkpoints: each chunk written once, restored onto other world
sizes and placements bit for bit, damaged pieces named, no step committed without every rank.

The ranks are real processes (sharded_checkpoint_worker.py, gloo on the CPU)."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zerowait
from zerowait import _core
from helpers import flip_byte, run_rank_reports

sys.path.insert(0, str(Path(__file__).parent))
from sharded_checkpoint_worker import PIECE_BYTES, equal_bits, reference  # noqa: E402

HERE = Path(__file__).parent


def run_ranks(mode: str, world_size: int, directory: Path, out: Path) -> list:
    """The worker's reports from `world_size` ranks (helpers.run_rank_reports)."""
    return run_rank_reports(HERE / "sharded_checkpoint_worker.py", mode, world_size, directory, out)


@pytest.fixture(scope="module")
def saved_by_two(tmp_path_factory):
    """Step 1 saved by two ranks, every tensor Shard(0) except "rep" (Replicate)."""
    root = tmp_path_factory.mktemp("sharded")
    reports = run_ranks("save", 2, root / "ckpt", root / "out")
    assert [r["save"]["committed"] for r in reports] == [True, True]
    return root / "ckpt"


def piece_bytes_by_rank(directory: Path, step: int, pointer: str) -> dict:
    """Bytes of `pointer`'s pieces in each rank's part of the step (from its rank manifest)."""
    world = _core._ckpt_step_info(str(directory), step)["world_size"]
    counts = {}
    for rank in range(world):
        manifest = _core._CheckpointReader(str(directory), step, rank).manifest()
        counts[rank] = sum(t["nbytes"] for t in manifest["tensors"]
                           if t["name"].startswith(pointer + "~chunk"))
    return counts


def test_each_chunk_written_once_and_restored_whole_in_one_process(saved_by_two):
    full = reference()
    assert _core._ckpt_verify(str(saved_by_two), 1)["problems"] == []
    # Shard(0) chunks: half on each rank; the Replicate tensor by rank 0 alone, once.
    assert piece_bytes_by_rank(saved_by_two, 1, "/model/w") == {0: 6 * 6 * 4, 1: 5 * 6 * 4}
    assert piece_bytes_by_rank(saved_by_two, 1, "/model/rep") == {0: full["rep"].nbytes, 1: 0}
    # One process, no process group: plain tensors as targets get the whole tensors.
    ckpt = zerowait.Checkpointer(saved_by_two)
    targets = {name: torch.zeros_like(t) for name, t in full.items()}
    loaded = ckpt.load(1, into={"model": targets})
    assert loaded["step"] == 1 and loaded["rank_value"] == 0  # rank 0's per-rank values
    for name, t in full.items():
        assert loaded["model"][name] is targets[name]
        assert equal_bits(targets[name], t), name
    fresh = ckpt.load(1)["model"]  # no targets: new full tensors
    assert all(equal_bits(fresh[name], t) for name, t in full.items())


@pytest.mark.parametrize("world_size", [3, 4])
def test_restore_onto_other_world_sizes_and_placements(saved_by_two, tmp_path, world_size):
    reports = run_ranks("load", world_size, saved_by_two, tmp_path / "out")
    layouts = ["shard0", "shard1", "replicate"] + (["2d"] if world_size == 4 else [])
    for rank, report in enumerate(reports):
        for layout in layouts:
            assert report[layout] == {name: True for name in reference()}, (rank, layout)
        # Per-rank values: a rank the saving job had keeps its own, the others get rank 0's.
        assert report["rank_value"] == (rank * 10 if rank < 2 else 0)


def test_hsdp_save_on_four_restores_on_two(tmp_path):
    directory = tmp_path / "ckpt"
    saved = run_ranks("save-hsdp", 4, directory, tmp_path / "save")
    assert all(r["save"]["committed"] for r in saved)
    full = reference()
    # Replicated over the mesh's first dimension: ranks 0 and 1 write, ranks 2 and 3 do not.
    assert piece_bytes_by_rank(directory, 1, "/model/w") == {0: 6 * 6 * 4, 1: 5 * 6 * 4,
                                                             2: 0, 3: 0}
    rep = piece_bytes_by_rank(directory, 1, "/model/rep")
    assert rep == {0: full["rep"].nbytes, 1: 0, 2: 0, 3: 0}
    for report in run_ranks("load", 2, directory, tmp_path / "load"):
        for layout in ("shard0", "shard1", "replicate"):
            assert report[layout] == {name: True for name in reference()}, layout


def test_fsdp2_state_restores_whole_in_one_process(tmp_path):
    directory = tmp_path / "ckpt"
    run_ranks("fsdp", 2, directory, tmp_path / "out")
    expected = torch.load(tmp_path / "out" / "reference.pt")
    loaded = zerowait.Checkpointer(directory).load(1)

    def check(a, b, where):
        if isinstance(b, dict):
            assert list(a) == list(b), where
            for key in b:
                check(a[key], b[key], f"{where}[{key!r}]")
        elif isinstance(b, torch.Tensor):
            assert equal_bits(a, b), where
        else:
            assert a == b, where

    check(loaded, expected, "state")
    assert set(expected["optim"]["state"][0]) >= {"exp_avg", "exp_avg_sq"}


def test_sharded_tensor_saved_and_resharded(tmp_path):
    directory = tmp_path / "ckpt"
    reports = run_ranks("sharded-tensor", 2, directory, tmp_path / "out")
    assert reports == [{"rank": r, "same_object": True, "equal": True} for r in range(2)]
    assert piece_bytes_by_rank(directory, 1, "/model/w") == {0: 6 * 6 * 4, 1: 5 * 6 * 4}
    whole = zerowait.Checkpointer(directory).load(1)["model"]["w"]
    assert equal_bits(whole, reference()["w"])


def test_whole_tensors_saved_by_one_process_restore_into_dtensors(tmp_path):
    directory = tmp_path / "ckpt"
    with zerowait.Checkpointer(directory) as ckpt:
        ckpt.save(1, {"model": reference(), "step": 1, "rank_value": 0}, blocking=True)
    for report in run_ranks("load", 2, directory, tmp_path / "out"):
        for layout in ("shard0", "shard1", "replicate"):
            assert report[layout] == {name: True for name in reference()}, layout
        assert report["rank_value"] == 0  # the one process's values, on every rank


def upload(directory: Path, url: str) -> None:
    """Copies a checkpoint directory to the bucket's prefix `url`, file by file (curl, SigV4)."""
    bucket_and_prefix = url.removeprefix("s3://")
    region = os.environ.get("AWS_REGION", "us-east-1")
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        key = f"{bucket_and_prefix}/{path.relative_to(directory)}"
        subprocess.run(
            ["curl", "-sS", "--fail", "-T", str(path), f"{os.environ['AWS_ENDPOINT_URL']}/{key}",
             "--aws-sigv4", f"aws:amz:{region}:s3", "--user",
             f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}",
             "-H", f"x-amz-content-sha256: {hashlib.sha256(path.read_bytes()).hexdigest()}"],
            check=True, timeout=60, stdin=subprocess.DEVNULL, capture_output=True)


def test_resharding_reads_ranges_from_s3(saved_by_two, tmp_path, bucket):
    url = f"s3://{bucket}/sharded"
    upload(saved_by_two, url)
    whole = zerowait.Checkpointer(url).load(1)["model"]
    assert all(equal_bits(whole[name], t) for name, t in reference().items())
    for report in run_ranks("load", 3, url, tmp_path / "out"):
        for layout in ("shard0", "shard1", "replicate"):
            assert report[layout] == {name: True for name in reference()}, layout


def test_damaged_piece_is_named_by_the_ranged_read_that_covers_it(saved_by_two, tmp_path):
    directory = tmp_path / "ckpt"
    shutil.copytree(saved_by_two, directory)
    # "w" (11 rows of 24 bytes) was saved as rows 0..5 (rank 0) and 6..10 (rank 1), in pieces
    # of 64 bytes: rows 0..5 are pieces 0-2, piece 2 holding rows 5.33..5. Restored with
    # Shard(0) onto three ranks (rows 0..3, 4..7, 8..10), only rank 1's target reads piece 2.
    manifest = _core._CheckpointReader(str(directory), 1, 0).manifest()
    pieces = [t for t in manifest["tensors"] if t["name"].startswith("/model/w~chunk0~")]
    assert len(pieces) == -(-6 * 6 * 4 // PIECE_BYTES) == 3
    damaged = pieces[2]
    flip_byte(directory / damaged["file"], damaged["offset"] + 3)
    reports = run_ranks("load-damaged", 3, directory, tmp_path / "out")
    for rank in (0, 2):  # the pieces they read are intact, and so are their tensors
        assert "error" not in reports[rank] and all(reports[rank]["shard0"].values()), rank
    error = reports[1]["error"]
    assert "/model/w~chunk0~piece2" in error and Path(damaged["file"]).name in error
    assert str(damaged["offset"]) in error, error


def test_pieces_read_straight_into_a_target_or_through_a_buffer_alike(saved_by_two, tmp_path):
    # A contiguous target is read into in place (a Shard(0) chunk is one run of its bytes); a
    # transposed one (each chunk strided in it) through a buffer. Both bit for bit, and a
    # damaged piece is named either way.
    full = reference()
    ckpt = zerowait.Checkpointer(saved_by_two)

    def transposed(t):
        return torch.zeros(tuple(reversed(t.shape)), dtype=t.dtype).t() if t.dim() == 2 \
            else torch.zeros_like(t)

    for make in (torch.zeros_like, transposed):
        targets = {name: make(t) for name, t in full.items()}
        assert make is torch.zeros_like or not targets["w"].is_contiguous()
        ckpt.load(1, into={"model": targets})
        assert all(equal_bits(targets[name], t) for name, t in full.items()), make
    directory = tmp_path / "ckpt"
    shutil.copytree(saved_by_two, directory)
    manifest = _core._CheckpointReader(str(directory), 1, 1).manifest()
    damaged = next(t for t in manifest["tensors"] if t["name"] == "/model/w~chunk1~piece1")
    flip_byte(directory / damaged["file"], damaged["offset"] + 5)
    damaged_ckpt = zerowait.Checkpointer(directory)
    for make in (torch.zeros_like, transposed):
        with pytest.raises(_core.CorruptDataError, match="/model/w~chunk1~piece1") as error:
            damaged_ckpt.load(1, into={"model": {name: make(t) for name, t in full.items()}})
        assert "saved by rank 1" in str(error.value) and str(damaged["offset"]) in str(error.value)


def test_background_copy_of_pieces_waits_for_the_step_and_catches_an_edit(tmp_path):
    """The pieces of a DTensor an optimizer owns are copied after save() returns, guarded as a
    plain tensor is (test_checkpoint_nonblocking.py): many pieces per chunk here."""
    reports = run_ranks("background-copy", 2, tmp_path / "ckpt", tmp_path / "out")
    for report in reports:
        assert report["copied_at_return"] is False
        assert report["save"]["committed"]
        assert report["changed_by_step"] and report["holds_values_before_step"]
        assert "changed in place" in report["edit"] and "/model/w~chunk" in report["edit"]


def test_a_rank_killed_before_commit_leaves_no_committed_step(tmp_path):
    directory = tmp_path / "ckpt"
    reports = run_ranks("kill", 2, directory, tmp_path / "out")
    assert reports[1] is None  # killed before it wrote its report
    assert reports[0]["step2"] != "committed", reports[0]
    assert zerowait.Checkpointer(directory).steps() == [1]
    assert not (directory / "step-2").exists()
    loaded = zerowait.Checkpointer(directory).load()["model"]
    assert all(equal_bits(loaded[name], t) for name, t in reference().items())
