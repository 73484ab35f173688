"""`zerowait ckpt ls|verify|inspect|gc|restore`, run as a real process on checkpoints written by
the engine itself (zerowait._core._Checkpointer): full and incremental saves, retention, a
damaged byte, a mirror, orphaned step-N.tmp directories, two ranks, and bad inputs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import flip_byte
from zerowait import _core

# safetensors dtype name, element size, floating point.
DTYPES = {np.dtype(np.float32): ("F32", 4, True), np.dtype(np.int64): ("I64", 8, False),
          np.dtype(np.uint8): ("U8", 1, False)}


def run(cli, *args):
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)


def run_json(cli, *args):
    result = run(cli, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def save(checkpointer, step: int, tensors: dict[str, np.ndarray], structure) -> dict:
    """Saves `tensors` as step `step` and waits for the commit."""
    specs = []
    for name, array in tensors.items():
        dtype, element_size, floating = DTYPES[array.dtype]
        specs.append((name, dtype, list(array.shape), element_size, floating, array.ctypes.data,
                      array.nbytes))
    pending = checkpointer.begin_save(step, specs, json.dumps(structure), False)
    pending.copy_host_tensors()
    return pending.start().wait()


def the_state(step: int) -> dict[str, np.ndarray]:
    """Weights that change every step, an embedding that never does, a step counter."""
    return {
        "/model/weight": np.arange(3000, dtype=np.float32).reshape(30, 100) * step,
        "/model/embedding": (np.arange(65536) % 251).astype(np.uint8).reshape(256, 256),
        "/optimizer/step": np.array([step], dtype=np.int64),
    }


def structure(step: int) -> dict:
    return {"step": step, "marker": "structure-blob-" + "x" * 64}


@pytest.fixture()
def ckpt_dir(tmp_path) -> Path:
    """Steps 10, 20, 30 saved incrementally with keep_last=2: step 10 is retired, but its file
    holding the embedding stays, referenced by steps 20 and 30."""
    root = tmp_path / "ckpt"
    checkpointer = _core._Checkpointer(root, keep_last=2, incremental=True)
    for step in (10, 20, 30):
        result = save(checkpointer, step, the_state(step), structure(step))
        assert result["committed"]
    checkpointer.wait_all()
    return root


def test_help_lists_the_ckpt_commands(cli):
    top = run(cli, "--help")
    assert top.returncode == 0 and "ckpt" in top.stdout
    group = run(cli, "ckpt", "--help")
    assert group.returncode == 0, group.stderr
    for command in ("ls", "verify", "inspect", "gc"):
        assert command in group.stdout
    verify_help = run(cli, "ckpt", "verify", "--help")
    assert "Exit codes" in verify_help.stdout and "3 a step is damaged" in verify_help.stdout
    assert "only when no job" in run(cli, "ckpt", "gc", "--help").stdout


def test_ls_lists_committed_steps_and_the_retired_one(cli, ckpt_dir):
    result = run(cli, "ckpt", "ls", ckpt_dir)
    assert result.returncode == 0, result.stderr
    assert "30 (newest)" in result.stdout
    assert "not committed" in result.stdout and "step-10" in result.stdout

    listing = run_json(cli, "ckpt", "ls", ckpt_dir)
    assert listing["newest"] == 30
    steps = {s["step"]: s for s in listing["steps"]}
    assert sorted(steps) == [20, 30]
    full_bytes = sum(a.nbytes for a in the_state(1).values())
    for s in steps.values():
        assert s["world_size"] == 1 and s["bytes_total"] == full_bytes
        # Incremental: the unchanged embedding is referenced from step 10, not stored again.
        assert s["references"] == [10]
        assert 0 < s["bytes_stored"] < full_bytes
    assert steps[30]["newest"] and not steps[20]["newest"]
    [retired] = listing["not_committed"]
    assert (retired["name"], retired["state"]) == ("step-10", "retired")
    assert retired["referenced_by"] == [20, 30] and retired["files"] >= 1


def test_ls_of_an_empty_directory(cli, tmp_path):
    result = run(cli, "ckpt", "ls", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no committed checkpoints" in result.stdout
    assert run_json(cli, "ckpt", "ls", tmp_path) == {
        "path": str(tmp_path), "newest": None, "steps": [], "not_committed": []}


def test_inspect_json_matches_what_was_saved(cli, ckpt_dir):
    info = run_json(cli, "ckpt", "inspect", ckpt_dir, 30)
    assert (info["step"], info["world_size"], info["references"]) == (30, 1, [10])
    [rank] = info["ranks"]
    assert rank["rank"] == 0 and rank["structure"] == structure(30)
    saved = the_state(30)
    tensors = {t["name"]: t for t in rank["tensors"]}
    assert list(tensors) == list(saved)
    for name, array in saved.items():
        t = tensors[name]
        assert t["dtype"] == DTYPES[array.dtype][0]
        assert t["shape"] == list(array.shape)
        assert t["nbytes"] == t["stored_bytes"] == array.nbytes
        assert t["codec"] == "none"
    embedding = tensors["/model/embedding"]
    assert embedding["file"].startswith("step-10/") and embedding["referenced"]
    assert embedding["in_step"] == 10
    assert tensors["/model/weight"]["file"].startswith("step-30/")
    assert not tensors["/model/weight"]["referenced"]
    files = {f["path"]: f for f in rank["files"]}
    assert {t["file"] for t in tensors.values()} == set(files)
    for path, f in files.items():
        assert f["bytes"] == (ckpt_dir / path).stat().st_size
        assert f["container"] == "safetensors"

    text = run(cli, "ckpt", "inspect", ckpt_dir, 30)
    assert text.returncode == 0, text.stderr
    for name in saved:
        assert name in text.stdout
    assert "(from step 10)" in text.stdout
    assert "structure-blob" not in text.stdout  # the structure is only in --json


def test_verify_passes_on_intact_steps(cli, ckpt_dir):
    result = run(cli, "ckpt", "verify", ckpt_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step 30: ok" in result.stdout and "step 20: ok" in result.stdout
    report = run_json(cli, "ckpt", "verify", ckpt_dir, 20)
    assert report["ok"] and [s["step"] for s in report["steps"]] == [20]
    assert report["steps"][0]["tensors"] == 3


def test_verify_names_the_damaged_file_and_tensor(cli, ckpt_dir):
    rank = run_json(cli, "ckpt", "inspect", ckpt_dir, 30)["ranks"][0]
    weight = next(t for t in rank["tensors"] if t["name"] == "/model/weight")
    damaged = ckpt_dir / weight["file"]
    flip_byte(damaged, weight["offset"] + 17, mask=0x40)

    result = run(cli, "ckpt", "verify", ckpt_dir)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "step 30: FAILED" in result.stdout and "step 20: ok" in result.stdout
    assert str(damaged) in result.stdout and "'/model/weight'" in result.stdout
    report = json.loads(run(cli, "ckpt", "verify", ckpt_dir, 30, "--json").stdout)
    assert not report["ok"]
    [problem] = report["steps"][0]["problems"]
    assert str(damaged) in problem and "/model/weight" in problem
    assert run(cli, "ckpt", "verify", ckpt_dir, 20).returncode == 0


def test_gc_removes_orphaned_tmp_and_keeps_committed_steps(cli, ckpt_dir):
    settled = ckpt_dir / "step-25.tmp"  # below the newest committed step: never commits
    settled.mkdir()
    (settled / "rank-00000-00000.safetensors").write_bytes(b"\0" * 1000)
    running = ckpt_dir / "step-40.tmp"  # newer: a job may still be writing it
    running.mkdir()

    listing = run_json(cli, "ckpt", "ls", ckpt_dir)
    states = {d["name"]: d["state"] for d in listing["not_committed"]}
    assert states == {"step-10": "retired", "step-25.tmp": "orphaned", "step-40.tmp": "unfinished"}

    result = run(cli, "ckpt", "gc", ckpt_dir)
    assert result.returncode == 0, result.stderr
    assert "removed step-25.tmp" in result.stdout and "kept step-40.tmp" in result.stdout
    assert not settled.exists() and running.exists()
    assert [s["step"] for s in run_json(cli, "ckpt", "ls", ckpt_dir)["steps"]] == [20, 30]
    assert run(cli, "ckpt", "verify", ckpt_dir).returncode == 0

    report = run_json(cli, "ckpt", "gc", ckpt_dir, "--all-tmp")
    assert report["removed"] == ["step-40.tmp"] and not running.exists()


def test_gc_retention_keeps_files_that_newer_steps_reference(cli, ckpt_dir):
    report = run_json(cli, "ckpt", "gc", ckpt_dir, "--keep-last", "1")
    assert report["retired_steps"] == [20] and report["kept_steps"] == [30]
    assert report["bytes_freed"] > 0
    # Step 10's file holds the embedding that step 30 still uses.
    assert (ckpt_dir / "step-10").is_dir()
    assert run(cli, "ckpt", "verify", ckpt_dir).returncode == 0
    assert run(cli, "ckpt", "gc", ckpt_dir, "--keep-every", "10").returncode == 2


def test_inspect_one_rank_of_two(cli, tmp_path):
    root = tmp_path / "ckpt"
    checkpointers = [_core._Checkpointer(root, rank=r, world_size=2, commit_timeout_s=60)
                     for r in range(2)]
    arrays = [np.full(100, r, dtype=np.float32) for r in range(2)]
    handles = []
    for r, checkpointer in enumerate(checkpointers):
        pending = checkpointer.begin_save(
            5, [(f"/rank{r}", "F32", [100], 4, True, arrays[r].ctypes.data, arrays[r].nbytes)],
            json.dumps({"rank": r}), False)
        pending.copy_host_tensors()
        handles.append(pending.start())
    for handle in handles:
        handle.wait()

    both = run_json(cli, "ckpt", "inspect", root, 5)
    assert [r["rank"] for r in both["ranks"]] == [0, 1]
    one = run_json(cli, "ckpt", "inspect", root, 5, "--rank", 1)
    [rank] = one["ranks"]
    assert rank["rank"] == 1 and [t["name"] for t in rank["tensors"]] == ["/rank1"]
    assert rank["structure"] == {"rank": 1}
    missing = run(cli, "ckpt", "inspect", root, 5, "--rank", 2)
    assert missing.returncode == 1 and "rank 2" in missing.stderr
    assert run(cli, "ckpt", "verify", root).returncode == 0


def test_errors_name_the_directory_and_the_committed_steps(cli, ckpt_dir, tmp_path):
    missing = tmp_path / "no-such-dir"
    for command in (("ls", missing), ("verify", missing), ("inspect", missing, 1), ("gc", missing)):
        result = run(cli, "ckpt", *command)
        assert result.returncode == 1, command
        assert str(missing) in result.stderr and "does not exist" in result.stderr

    for command in ("inspect", "verify"):
        result = run(cli, "ckpt", command, ckpt_dir, 25)
        assert result.returncode == 1
        assert "step 25 is not a committed checkpoint" in result.stderr
        assert "committed steps: 20, 30" in result.stderr
    retired = run(cli, "ckpt", "inspect", ckpt_dir, 10)
    assert retired.returncode == 1 and "step-10 was retired" in retired.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    result = run(cli, "ckpt", "inspect", empty, 1)
    assert result.returncode == 1 and "there are no committed checkpoints" in result.stderr
    assert run(cli, "ckpt", "inspect", ckpt_dir, -1).returncode == 2


def test_restore_proves_a_step_restores_from_either_tier(cli, tmp_path):
    """`ckpt restore` reads and checks every tensor the way load() picks its copy: the primary
    copy while intact, the mirror's copy of the same step once the primary is damaged, an older
    step without --step, and exit 3 naming the tensor and file when no copy restores."""
    root, mirror = tmp_path / "ckpt", tmp_path / "mirror"
    checkpointer = _core._Checkpointer(root, mirror=mirror)
    for step in (1, 2):
        assert save(checkpointer, step, the_state(step), structure(step))["committed"]
    checkpointer.wait_all()

    report = run_json(cli, "ckpt", "restore", root, "--mirror", mirror)
    assert (report["ok"], report["step"], report["tier"]) == (True, 2, "primary")
    [copy] = report["copies"]
    assert [t["name"] for t in copy["tensors"]] == list(the_state(2))
    assert all(t["ok"] for t in copy["tensors"])
    assert report["bytes"] == sum(a.nbytes for a in the_state(2).values())

    rank = run_json(cli, "ckpt", "inspect", root, 2)["ranks"][0]
    weight = next(t for t in rank["tensors"] if t["name"] == "/model/weight")
    damaged = root / weight["file"]
    flip_byte(damaged, weight["offset"] + 17, mask=0x40)

    report = run_json(cli, "ckpt", "restore", root, "--mirror", mirror)
    assert (report["ok"], report["step"], report["tier"]) == (True, 2, "mirror")
    primary, from_mirror = report["copies"]
    assert (primary["tier"], primary["ok"], from_mirror["ok"]) == ("primary", False, True)
    [bad] = [t for t in primary["tensors"] if not t["ok"]]
    assert bad["name"] == "/model/weight" and str(damaged) in bad["error"]
    text = run(cli, "ckpt", "restore", root, "--mirror", mirror)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "step 2, primary copy in" in text.stdout and "FAILED" in text.stdout
    assert f"restores from the mirror copy in {mirror}" in text.stdout

    # Without the mirror, step 2 does not restore; without --step, step 1 does.
    failed = run(cli, "ckpt", "restore", root, "--step", 2)
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "'/model/weight'" in failed.stdout and str(damaged) in failed.stdout
    assert "FAILED: rank 0 does not restore from step 2" in failed.stdout
    report = run_json(cli, "ckpt", "restore", root)
    assert (report["step"], report["tier"]) == (1, "primary")
    assert [c["step"] for c in report["copies"]] == [2, 1]
