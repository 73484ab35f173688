"""WebDataset .tar shards written by Python's own tarfile module, read in place and packed."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path

import pytest

import zerowait
from helpers import dataset_contents


def write_webdataset_tar(path: Path, samples: int, seed: int, fmt=tarfile.PAX_FORMAT,
                         prefix: str = "shard-a"):
    """Writes samples with fields "bin" (random bytes), "cls", "meta.json"; returns key -> fields.

    One key is longer than ustar's 100-byte name field, so the tar needs a pax (or GNU) record.
    """
    rng = random.Random(seed)
    expected = {}
    with tarfile.open(path, "w", format=fmt) as tar:
        for i in range(samples):
            key = f"{prefix}/{i:06d}" if i != 2 else f"{prefix}/deep/" + "x" * 120 + "/000002"
            fields = {
                "cls": str(i % 4).encode(),
                "bin": rng.randbytes(rng.randint(0, 3000)),
                "meta.json": b'{"i": %d}' % i,
            }
            for name, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{name}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                tar.addfile(info, io.BytesIO(data))
            expected[key] = fields
    return expected


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_tar_is_read_in_place(tmp_path, fmt):
    tar_path = tmp_path / "train-000.tar"
    expected = write_webdataset_tar(tar_path, samples=9, seed=5, fmt=fmt)

    ds = zerowait.Dataset(tar_path)
    assert len(ds) == 9
    assert ds.fields == ["bin", "cls", "meta.json"]
    assert dataset_contents(ds) == expected
    assert ds[-1] == expected[ds.key(8)]
    # The index is cached beside the tar and serves the next open.
    sidecar = Path(str(tar_path) + ".zwidx")
    assert sidecar.exists()
    assert dataset_contents(zerowait.Dataset(tar_path, io="mmap")) == expected


def test_directory_of_tars_is_one_dataset(tmp_path):
    expected = {}
    for n in range(2):
        expected.update(write_webdataset_tar(tmp_path / f"train-{n:03d}.tar", samples=5, seed=n,
                                             prefix=f"part{n}"))
    ds = zerowait.Dataset(tmp_path)
    assert ds.shard_count == 2
    assert [s["samples"] for s in ds.shards] == [5, 5]
    assert dataset_contents(ds) == expected


def test_tar_packs_into_identical_samples(tmp_path):
    tar_path = tmp_path / "train.tar"
    expected = write_webdataset_tar(tar_path, samples=12, seed=9)
    report = zerowait.pack([tar_path], tmp_path / "shards", sync=False)
    assert report["samples"] == 12 and report["quarantined"] == []
    assert dataset_contents(zerowait.Dataset(tmp_path / "shards")) == expected


def test_truncated_tar_is_corrupt_data_error(tmp_path):
    tar_path = tmp_path / "broken.tar"
    write_webdataset_tar(tar_path, samples=6, seed=1)
    with tarfile.open(tar_path) as tar:
        biggest = max(tar.getmembers(), key=lambda m: m.size)
    # Cut inside the biggest member's data, so the archive ends mid-member.
    data = tar_path.read_bytes()
    tar_path.write_bytes(data[: biggest.offset_data + biggest.size // 2])
    with pytest.raises(zerowait.CorruptDataError, match="broken.tar"):
        zerowait.Dataset(tar_path)
