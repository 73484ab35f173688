"""C++ statuses surface as Python exceptions that are both zerowait's and the built-in kind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import zerowait
from helpers import flip_byte


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (zerowait.ZerowaitNotFoundError, FileNotFoundError),
        (zerowait.CorruptDataError, ValueError),
        (zerowait.InvalidArgumentError, ValueError),
        (zerowait.DeadlineExceededError, TimeoutError),
        (zerowait.AlreadyExistsError, FileExistsError),
        (zerowait.ZerowaitIOError, OSError),
        (zerowait.InternalError, RuntimeError),
        (zerowait.UnsupportedError, Exception),
        (zerowait.CancelledError, Exception),
    ],
)
def test_error_classes_derive_from_zerowait_error_and_a_builtin(cls, builtin):
    assert issubclass(cls, zerowait.ZerowaitError)
    assert issubclass(cls, builtin)
    assert cls.__module__ == "zerowait"
    assert cls.__doc__


def test_missing_dataset_is_file_not_found_naming_the_path(tmp_path):
    missing = tmp_path / "no-such-dataset"
    with pytest.raises(FileNotFoundError) as info:
        zerowait.Dataset(missing)
    assert isinstance(info.value, zerowait.ZerowaitError)
    assert str(missing) in str(info.value)
    assert info.value.code == "not_found"


def test_missing_pack_source_is_file_not_found_naming_the_path(tmp_path):
    missing = tmp_path / "no-such-tree"
    with pytest.raises(zerowait.ZerowaitNotFoundError, match="no-such-tree"):
        zerowait.pack(missing, tmp_path / "out")


def test_bad_io_backend_is_value_error_naming_the_choices(tmp_path, random_tree):
    root, _ = random_tree
    zerowait.pack(root, tmp_path / "shards", sync=False)
    with pytest.raises(ValueError, match="pread") as info:
        zerowait.Dataset(tmp_path / "shards", io="carrier-pigeon")
    assert isinstance(info.value, zerowait.InvalidArgumentError)


def test_invalid_pack_option_is_value_error(random_tree, tmp_path):
    root, _ = random_tree
    with pytest.raises(ValueError, match="shard size"):
        zerowait.pack(root, tmp_path / "out", shard_size=0)


def test_pack_refuses_to_replace_a_dataset_unless_told(random_tree, tmp_path):
    root, _ = random_tree
    out = tmp_path / "shards"
    zerowait.pack(root, out, sync=False)
    with pytest.raises(FileExistsError, match="overwrite"):
        zerowait.pack(root, out, sync=False)
    assert zerowait.pack(root, out, sync=False, overwrite=True)["samples"] == 40


def _packed_copy(random_tree, tmp_path) -> tuple[Path, Path]:
    """Packs the tree into one shard; returns (dataset dir, shard path)."""
    root, _ = random_tree
    out = tmp_path / "shards"
    zerowait.pack(root, out, sync=False)
    (shard,) = sorted(out.glob("*.zws"))
    return out, shard


def test_corrupt_footer_is_corrupt_data_error_naming_the_shard(random_tree, tmp_path):
    out, shard = _packed_copy(random_tree, tmp_path)
    flip_byte(shard, shard.stat().st_size - 20)
    with pytest.raises(zerowait.CorruptDataError) as info:
        ds = zerowait.Dataset(out)
        ds[0]  # a manifest opens shards lazily, on first use
    assert shard.name in str(info.value)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "corrupt"
    # The shard on its own is refused at open, with the same kind of error.
    with pytest.raises(zerowait.CorruptDataError, match=shard.name):
        zerowait.Dataset(shard)


def test_corrupt_sample_is_found_by_verify_and_by_verified_reads(random_tree, tmp_path):
    out, shard = _packed_copy(random_tree, tmp_path)
    flip_byte(shard, 4096 + 10)  # inside the first sample: the data region starts at 4 KiB

    ds = zerowait.Dataset(out)
    bad = ds.verify()
    assert len(bad) == 1
    assert bad[0]["index"] == 0 and bad[0]["shard_index"] == 0
    assert bad[0]["key"] == ds.key(0)
    assert Path(bad[0]["shard"]).name == shard.name
    assert bad[0]["reason"]

    ds[0]  # unverified reads trust the bytes
    verified = zerowait.Dataset(out, verify=True)
    with pytest.raises(zerowait.CorruptDataError) as info:
        verified[0]
    assert shard.name in str(info.value) and ds.key(0) in str(info.value)
    assert verified[1] == ds[1]


def test_missing_shard_of_a_manifest_names_it(random_tree, tmp_path):
    out, shard = _packed_copy(random_tree, tmp_path)
    moved = tmp_path / "elsewhere.zws"
    shutil.move(shard, moved)
    with pytest.raises(zerowait.ZerowaitError) as info:
        ds = zerowait.Dataset(out)
        ds[0]
    assert shard.name in str(info.value)
    assert isinstance(info.value, FileNotFoundError)
