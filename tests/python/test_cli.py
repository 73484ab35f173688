"""The `zerowait` command that `pip install .` installs, run as a real process."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

import zerowait
from helpers import read_tree


def run(cli, *args):
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)


def test_help_lists_the_commands(cli):
    result = run(cli, "--help")
    assert result.returncode == 0, result.stderr
    for command in ("pack", "inspect", "verify"):
        assert command in result.stdout


def test_version_matches_the_package(cli):
    result = run(cli, "--version")
    assert result.returncode == 0
    assert zerowait.__version__ in result.stdout


@pytest.mark.parametrize("args,message", [
    (["doctr"], "unknown command 'doctr'; did you mean 'doctor'?"),
    (["cache", "stats"], "unknown command 'stats'; did you mean 'status'?"),
    # Nothing close: the word, and the commands there are instead of a guess.
    (["bench", "disk"], "unknown command 'disk'; the commands of 'zerowait bench' are storage, files, net"),
])
def test_a_mistyped_command_names_the_word_and_the_nearest(cli, args, message):
    result = run(cli, *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("zerowait: error: " + message), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_a_missing_command_is_still_said_so(cli):
    result = run(cli, "bench")
    assert result.returncode == 2
    assert "A subcommand is required" in result.stderr


def test_inspect_json_describes_a_packed_dataset(cli, image_tree, image_dataset):
    result = run(cli, "inspect", "--json", image_dataset)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    ds = zerowait.Dataset(image_dataset)
    assert info["samples"] == len(ds) == 48
    assert info["shard_count"] == ds.shard_count
    assert info["fields"] == ds.fields
    assert info["classes"] == ds.classes


def test_cli_packs_what_python_reads(cli, random_tree, tmp_path):
    root, expected = random_tree
    out = tmp_path / "shards"
    result = run(cli, "pack", root, "-o", out, "--no-sync")
    assert result.returncode == 0, result.stderr
    ds = zerowait.Dataset(out)
    assert {ds.key(i): ds[i] for i in range(len(ds))} == expected
    assert run(cli, "verify", out).returncode == 0


def test_cli_error_names_the_missing_path(cli, tmp_path):
    missing = tmp_path / "nothing-here"
    result = run(cli, "inspect", missing)
    assert result.returncode == 1
    assert str(missing) in result.stderr


def corrupt_copy(image_tree, root):
    """A copy of image_tree in which three JPEGs are damaged: two cut short (both pack modes
    quarantine them) and one whose entropy-coded data lost 200 bytes mid-scan (its markers are
    intact: only a full decode, `--verify-images`, finds it). Returns (cut, damaged) paths."""
    shutil.copytree(image_tree, root)
    jpegs = sorted(root.rglob("*.jpg"))
    cut = jpegs[1:3]
    for path in cut:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    damaged = jpegs[5]
    data = damaged.read_bytes()
    sos = data.index(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")
    middle = scan + (len(data) - scan) // 2
    damaged.write_bytes(data[:middle] + data[middle + 200:])
    return cut, damaged


def quarantined(out) -> dict:
    """quarantine.json as path -> reason."""
    report = json.loads((out / "quarantine.json").read_text())
    assert report["count"] == len(report["entries"])
    return {entry["path"]: entry["reason"] for entry in report["entries"]}


def test_pack_verify_images_quarantines_what_only_a_decode_finds(cli, image_tree, tmp_path):
    cut, damaged = corrupt_copy(image_tree, tmp_path / "src")
    structure = run(cli, "pack", tmp_path / "src", "-o", tmp_path / "structure", "--imagefolder",
                    "--no-sync")
    assert structure.returncode == 3, structure.stderr
    assert set(quarantined(tmp_path / "structure")) == {str(p) for p in cut}
    # The damaged JPEG passed the structure check and was packed.
    assert len(zerowait.Dataset(tmp_path / "structure")) == 48 - 2

    decoded = run(cli, "pack", tmp_path / "src", "-o", tmp_path / "decoded", "--imagefolder",
                  "--verify-images", "--no-sync")
    assert decoded.returncode == 3, decoded.stderr
    reasons = quarantined(tmp_path / "decoded")
    assert set(reasons) == {str(p) for p in [*cut, damaged]}
    assert "JPEG decode failed" in reasons[str(damaged)]
    ds = zerowait.Dataset(tmp_path / "decoded")
    assert len(ds) == 48 - 3
    assert damaged.relative_to(tmp_path / "src").with_suffix("").as_posix() not in {
        ds.key(i) for i in range(len(ds))}


def test_pack_writes_the_same_bytes_with_1_and_8_threads(cli, image_tree, tmp_path):
    """Loading and checking run on N threads; the shards, manifest and quarantine report must
    not depend on N, quarantined files included."""
    corrupt_copy(image_tree, tmp_path / "src")
    outputs = []
    for threads in (1, 8):
        out = tmp_path / f"threads-{threads}"
        result = run(cli, "pack", tmp_path / "src", "-o", out, "--imagefolder", "--verify-images",
                     "--threads", threads, "--shard-size", "16K", "--no-sync")
        assert result.returncode == 3, result.stderr
        outputs.append(read_tree(out))
    one, eight = outputs
    assert len([name for name in one if name.endswith(".zws")]) > 3
    assert one.keys() == eight.keys()
    for name in one:
        assert one[name] == eight[name], f"{name} differs between 1 and 8 threads"


def test_ckpt_gc_keep_every_keeps_milestones_besides_the_newest(cli, tmp_path):
    root = tmp_path / "ckpt"
    with zerowait.Checkpointer(root) as checkpointer:
        for step in (5, 10, 15, 20, 25, 30, 35):
            checkpointer.save(step, {"w": np.full(1000, step, dtype=np.float32)}, blocking=True)
    result = run(cli, "ckpt", "gc", root, "--keep-last", "1", "--keep-every", "10", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["retired_steps"] == [5, 15, 25]
    assert report["kept_steps"] == [10, 20, 30, 35]
    assert report["bytes_freed"] > 0
    listing = json.loads(run(cli, "ckpt", "ls", root, "--json").stdout)
    assert [s["step"] for s in listing["steps"]] == [10, 20, 30, 35]
    assert run(cli, "ckpt", "verify", root).returncode == 0
    with zerowait.Checkpointer(root) as checkpointer:
        for step in (10, 20, 30, 35):
            assert (checkpointer.load(step)["w"] == step).all()
    # Without --keep-every the same retention keeps only the newest.
    report = json.loads(run(cli, "ckpt", "gc", root, "--keep-last", "1", "--json").stdout)
    assert report["retired_steps"] == [10, 20, 30] and report["kept_steps"] == [35]


def test_pack_in_parts_and_merge_read_like_one_pack(cli, image_tree, tmp_path):
    """Four `pack --part I/4` runs (as four machines would) and `merge` give the samples, class
    list and order of one pack of the same ImageFolder tree, with no shard copied."""
    whole = tmp_path / "whole"
    assert run(cli, "pack", image_tree, "-o", whole, "--imagefolder", "--no-sync").returncode == 0
    out = tmp_path / "parts"
    for i in range(4):
        result = run(cli, "pack", image_tree, "-o", out, "--imagefolder", "--shard-size", "16K",
                     "--part", f"{i}/4", "--no-sync", "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["part"] == {"index": i, "count": 4}
        assert report["manifest"] == str(out / f"part-{i:04d}-of-0004" / "manifest.json")
    assert not (out / "manifest.json").exists()

    result = run(cli, "merge", out, "--json", "--no-sync")
    assert result.returncode == 0, result.stderr
    merged = json.loads(result.stdout)
    assert merged["part_count"] == 4
    assert [p["dir"] for p in merged["parts"]] == [f"part-{i:04d}-of-0004" for i in range(4)]
    assert merged["samples"] == sum(p["samples"] for p in merged["parts"]) == 48
    assert merged["shards"] == sum(p["shards"] for p in merged["parts"]) > 4

    one, parts = zerowait.Dataset(whole), zerowait.Dataset(out)
    assert parts.classes == one.classes
    assert [parts.key(i) for i in range(len(parts))] == [one.key(i) for i in range(len(one))]
    assert {parts.key(i): parts[i] for i in range(len(parts))} == {
        one.key(i): one[i] for i in range(len(one))}
    assert run(cli, "verify", out).returncode == 0
    again = run(cli, "merge", out)
    assert again.returncode == 1 and "--overwrite" in again.stderr


def test_pack_part_rejects_bad_values(cli, random_tree, tmp_path):
    root, _ = random_tree
    for value in ("3/3", "0/0", "x", "1/2/3", "-1/2"):
        result = run(cli, "pack", root, "-o", tmp_path / "out", "--part", value)
        assert result.returncode == 2, (value, result.stderr)
        assert "--part" in result.stderr and value in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_merge_refuses_a_missing_part(cli, random_tree, tmp_path):
    root, _ = random_tree
    out = tmp_path / "out"
    for i in (0, 1, 3):
        assert run(cli, "pack", root, "-o", out, "--part", f"{i}/4", "--no-sync").returncode == 0
    result = run(cli, "merge", out)
    assert result.returncode == 1
    assert "1 of 4 parts missing (2)" in result.stderr
    assert "--part 2/4" in result.stderr and "part-0002-of-0004" in result.stderr
    assert not (out / "manifest.json").exists()


def test_cache_status_and_warm_report_the_page_cache_share(cli, image_dataset):
    import os

    for shard in zerowait.Dataset(str(image_dataset)).shards:
        fd = os.open(shard["path"], os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    status = run(cli, "cache", "status", image_dataset, "--json", "--files")
    assert status.returncode == 0, status.stderr
    before = json.loads(status.stdout)["residency"]
    assert before["bytes"] == sum(f["bytes"] for f in before["files"]) > 0
    warm = run(cli, "cache", "warm", image_dataset, "--json")
    assert warm.returncode == 0, warm.stderr
    report = json.loads(warm.stdout)
    assert report["after"]["resident_share"] == 1.0 and not report["capped"]
    assert report["before"]["resident_bytes"] == before["resident_bytes"]
    assert report["bytes_read"] >= before["bytes"] - before["resident_bytes"]
    text = run(cli, "cache", "status", image_dataset)
    assert "resident (100 %)" in text.stdout
    missing = run(cli, "cache", "warm", image_dataset / "nope")
    assert missing.returncode == 1 and "nope" in missing.stderr
