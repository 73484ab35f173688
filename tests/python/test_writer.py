"""Datasets written from Python objects (zerowait.ShardWriter, zerowait.write_dataset): a Hugging
Face `datasets` table built here reads back field for field and passes `zerowait verify`; values
are stored as documented; a failing loop publishes nothing; bad images are quarantined as `pack`
does; a bucket is written as a directory is."""

from __future__ import annotations

import io
import json
import subprocess

import numpy as np
import pytest
import torch

import zerowait
from PIL import Image


def jpeg_bytes(seed: int, size=(40, 30)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_a_hugging_face_table_reads_back_field_for_field_and_verifies(tmp_path, cli):
    datasets = pytest.importorskip("datasets", reason="scripts/setup.sh installs `datasets`")
    rows = 60
    table = datasets.Dataset.from_dict({
        "__key__": [f"doc/{i:04d}" for i in range(rows)],
        "jpg": [jpeg_bytes(i) for i in range(rows)],
        "txt": [f"a caption for picture {i}, ünïcode" for i in range(rows)],
        "cls": [i % 7 for i in range(rows)],
        "json": [{"width": 40, "height": 30, "tags": ["t"] * (i % 3)} for i in range(rows)],
        "score": [i / 8 for i in range(rows)],
    })
    report = zerowait.write_dataset(table, tmp_path / "out", shard_size=64 << 10,
                                    classes=[f"c{k}" for k in range(7)])
    assert report["samples"] == rows
    assert report["shards"] > 1
    assert report["quarantined"] == []
    assert report["manifest_path"] == str(tmp_path / "out" / "manifest.json")

    ds = zerowait.Dataset(tmp_path / "out")
    assert len(ds) == rows
    assert ds.fields == ["cls", "jpg", "json", "score", "txt"]
    assert ds.classes == [f"c{k}" for k in range(7)]
    for i, row in enumerate(table):
        assert ds.key(i) == row["__key__"]
        assert ds[i] == {
            "jpg": row["jpg"],
            "txt": row["txt"].encode(),
            "cls": str(row["cls"]).encode(),
            "json": json.dumps(row["json"], ensure_ascii=False).encode(),
            "score": repr(row["score"]).encode(),
        }
        assert json.loads(ds[i]["json"]) == row["json"]

    # The loader reads it as it reads a packed dataset.
    loader = zerowait.Loader(tmp_path / "out", batch_size=16, shuffle="none",
                             decode={"cls": "int"}, fields=["cls"])
    assert torch.cat([b["cls"] for b in loader]).tolist() == table["cls"]

    verify = subprocess.run([str(cli), "verify", str(tmp_path / "out")], capture_output=True,
                            text=True, timeout=120)
    assert verify.returncode == 0, verify.stderr


def test_values_are_stored_as_documented(tmp_path):
    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    picture = Image.fromarray(np.full((5, 6, 3), 200, dtype=np.uint8))  # made here: no format
    with zerowait.ShardWriter(tmp_path / "out") as writer:
        assert writer.write({"npy": array, "pt.npy": torch.arange(5, dtype=torch.int16),
                             "png": picture, "flag": True, "n": np.int64(-3),
                             "x": np.float32(0.5), "raw": bytearray(b"\x00\x01"),
                             "gone": None})
        writer.write({"__key__": b"bytes-key", "list": [1, "two", {"three": 3.0}]})
        with pytest.raises(TypeError, match="field 'obj': cannot store a object"):
            writer.write({"obj": object()})
        assert writer.samples == 2
    ds = zerowait.Dataset(tmp_path / "out")
    first = ds[0]
    assert set(first) == {"npy", "pt.npy", "png", "flag", "n", "x", "raw"}  # None: left out
    stored = np.load(io.BytesIO(first["npy"]))
    assert stored.dtype == np.float32 and stored.shape == (2, 3, 4)
    assert np.array_equal(stored, array)
    assert np.load(io.BytesIO(first["pt.npy"])).tolist() == [0, 1, 2, 3, 4]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(first["png"]))), np.asarray(picture))
    assert (first["flag"], first["n"], first["x"], first["raw"]) == (b"1", b"-3", b"0.5",
                                                                     b"\x00\x01")
    assert ds.key(0) == "000000000"  # the sample's number, when it has no __key__
    assert ds.key(1) == "bytes-key"
    assert json.loads(ds[1]["list"]) == [1, "two", {"three": 3.0}]


def test_a_failing_loop_publishes_nothing_and_bad_images_are_quarantined(tmp_path):
    out = tmp_path / "out"

    def rows(fail_at=None):
        for i in range(10):
            if i == fail_at:
                raise RuntimeError("the source went away")
            good = jpeg_bytes(i)
            yield {"__key__": f"s{i}", "jpg": good if i != 4 else good[: len(good) // 2],
                   "cls": i}

    with pytest.raises(RuntimeError, match="the source went away"):
        zerowait.write_dataset(rows(fail_at=6), out, shard_size=8 << 10)
    assert not (out / "manifest.json").exists()
    assert not list(out.glob(".*.partial"))

    report = zerowait.write_dataset(rows(), out, shard_size=8 << 10)
    assert report["samples"] == 9
    assert [q["sample"] for q in report["quarantined"]] == ["s4"]
    assert "field 'jpg'" in report["quarantined"][0]["reason"]
    assert "s4" in (out / "quarantine.json").read_text()
    ds = zerowait.Dataset(out)
    assert [ds.key(i) for i in range(len(ds))] == [f"s{i}" for i in range(10) if i != 4]

    # An existing dataset is refused unless overwritten; a key used twice is refused and the
    # writer goes on.
    with pytest.raises(zerowait.AlreadyExistsError, match="overwrite"):
        zerowait.ShardWriter(out)
    with zerowait.ShardWriter(out, overwrite=True) as writer:
        writer.write({"__key__": "a", "txt": "first"})
        with pytest.raises(ValueError, match="sample key 'a' was written before"):
            writer.write({"__key__": "a", "txt": "again"})
        writer.write({"__key__": "b", "txt": "second"})
    assert writer.report["samples"] == 2
    assert writer.close() is writer.report
    with pytest.raises(ValueError, match="closed"):
        writer.write({"txt": "late"})
    ds = zerowait.Dataset(out)
    assert [ds[i]["txt"] for i in range(len(ds))] == [b"first", b"second"]
    assert len(list(out.glob("shard-*.zws"))) == ds.shard_count  # the old shards are gone


def test_a_dataset_written_to_a_bucket_reads_as_the_local_one(tmp_path, bucket):
    samples = [{"__key__": f"k{i}", "bin": np.random.default_rng(i).bytes(3000 + i), "cls": i}
               for i in range(50)]
    local = zerowait.write_dataset(samples, tmp_path / "local", shard_size=32 << 10)
    (tmp_path / "spool").mkdir()
    remote = zerowait.write_dataset(samples, f"s3://{bucket}/written", shard_size=32 << 10,
                                    tmp_dir=tmp_path / "spool")
    assert remote["manifest_path"] == f"s3://{bucket}/written/manifest.json"
    assert (remote["samples"], remote["shards"]) == (local["samples"], local["shards"])
    ds = zerowait.Dataset(f"s3://{bucket}/written/")
    here = zerowait.Dataset(tmp_path / "local")
    assert [ds[i] for i in range(len(ds))] == [here[i] for i in range(len(here))]


def test_datasets_written_on_their_own_merge_on_the_command_line(tmp_path, cli):
    """`zerowait merge OUT A B --whole-datasets` joins datasets written apart (as zerowait.ray's
    tasks write them) in the order given; without the flag they are refused (no part record),
    and a key in both is refused by name."""
    out = tmp_path / "ds"
    parts = [out / "task-0", out / "task-1"]
    for t, part in enumerate(parts):
        zerowait.write_dataset(({"__key__": f"t{t}-{i}", "txt": f"sample {i} of task {t}"}
                                for i in range(20)), part)
    plain = subprocess.run([str(cli), "merge", str(out), *map(str, parts)],
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode != 0 and plain.stderr.strip(), plain.stdout
    merged = subprocess.run([str(cli), "merge", str(out), *map(str, parts), "--whole-datasets",
                             "--json"], capture_output=True, text=True, timeout=60)
    assert merged.returncode == 0, merged.stderr
    assert json.loads(merged.stdout)["samples"] == 40
    ds = zerowait.Dataset(out)
    assert [ds.key(i) for i in range(len(ds))] == [f"t{t}-{i}" for t in (0, 1) for i in range(20)]
    assert ds[25]["txt"] == b"sample 5 of task 1"
    twice = tmp_path / "twice"
    for part in ("a", "b"):
        zerowait.write_dataset(({"__key__": "same", "txt": part} for _ in range(1)), twice / part)
    clash = subprocess.run([str(cli), "merge", str(twice), str(twice / "a"), str(twice / "b"),
                            "--whole-datasets"], capture_output=True, text=True, timeout=60)
    assert clash.returncode != 0 and "same" in clash.stderr, clash.stderr
