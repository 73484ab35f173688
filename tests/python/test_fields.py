"""NumPy arrays, text and JSON fields through the Loader: arrays stacked into tensors of their
own dtype (from the .npy header, or declared for bare bytes), text as str and JSON as Python
values in list columns; a sample whose field does not fit is a corrupt sample (on_corrupt)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

import zerowait
from helpers import batches_and_errors


def write(path, rows):
    zerowait.write_dataset(rows, path, shard_size=4 << 10)
    return path


def every_row(loader):
    rows = {}
    for batch in loader:
        for i, index in enumerate(batch["__index__"].tolist()):
            rows[index] = {k: v[i] for k, v in batch.items()}
    return rows


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int16", "uint8", "int64",
                                   "bool", "uint16"])
def test_npy_arrays_come_back_stacked_with_their_dtype_and_shape(tmp_path, dtype):
    rng = np.random.default_rng(1)
    arrays = [(rng.random((3, 5)) * 100).astype(dtype) for _ in range(20)]
    path = write(tmp_path / "ds", [{"x": a} for a in arrays])
    with zerowait.Loader(path, 6, decode={"x": zerowait.Array()}, output="numpy") as loader:
        got = every_row(loader)
    assert len(got) == 20
    for index, row in got.items():
        assert row["x"].dtype == np.dtype(dtype) and row["x"].shape == (3, 5)
        np.testing.assert_array_equal(row["x"], arrays[index])


def test_torch_tensors_written_and_a_declared_layout(tmp_path):
    tensors = [torch.full((4,), float(i)) for i in range(9)]
    path = write(tmp_path / "ds", [{"t": t, "raw": t.numpy().tobytes()} for t in tensors])
    decode = {"t": "npy", "raw": zerowait.Array("float32", (4,), header=False)}
    with zerowait.Loader(path, 4, shuffle="none", decode=decode) as loader:
        batch = loader.next()
    assert batch["t"].dtype == torch.float32 and batch["t"].shape == (4, 4)
    assert torch.equal(batch["t"], batch["raw"])
    assert torch.equal(batch["t"][3], tensors[3])


def test_a_sample_shaped_unlike_the_first_is_corrupt(tmp_path):
    rows = [{"__key__": f"k{i}", "x": np.zeros((2, 2) if i != 7 else (2, 3), np.float32)}
            for i in range(12)]
    path = write(tmp_path / "ds", rows)
    with zerowait.Loader(path, 5, shuffle="none", decode={"x": zerowait.Array()}) as loader:
        with pytest.raises(zerowait.CorruptDataError,
                           match=r"k7.*'x' is a float32 \[2, 3\] array, not the column's "
                                 r"float32 \[2, 2\]"):
            every_row(loader)
    with zerowait.Loader(path, 5, decode={"x": zerowait.Array()}, on_corrupt="skip") as loader:
        assert sorted(every_row(loader)) == [i for i in range(12) if i != 7]


def test_arrays_the_loader_cannot_copy_are_refused_with_the_fix(tmp_path):
    big_endian = np.arange(4, dtype=">i4")
    buffer = io.BytesIO()
    np.save(buffer, big_endian)
    path = write(tmp_path / "be", [{"x": buffer.getvalue()}])
    with pytest.raises(zerowait.UnsupportedError, match="big-endian.*little-endian"):
        zerowait.Loader(path, 1, decode={"x": zerowait.Array()})
    path = write(tmp_path / "noarray", [{"x": b"not an array"}])
    with pytest.raises(zerowait.CorruptDataError, match="sample 0.*not a .npy array"):
        zerowait.Loader(path, 1, decode={"x": "npy"})
    with pytest.raises(zerowait.InvalidArgumentError, match="needs a dtype"):
        zerowait.Array(header=False)
    with pytest.raises(zerowait.InvalidArgumentError, match="unknown dtype 'complex64'"):
        zerowait.Array("complex64", (2,))


def test_text_and_json_fields_become_python_values(tmp_path):
    rows = [{"txt": f"caption {i} é", "meta": json.dumps({"i": i, "tags": ["x"] * i}),
             "cls": i} for i in range(10)]
    path = write(tmp_path / "ds", rows)
    decode = {"txt": "text", "meta": "json", "cls": "int"}
    with zerowait.Loader(path, 4, decode=decode) as loader:
        got = every_row(loader)
    for index, row in got.items():
        assert row["txt"] == rows[index]["txt"]
        assert row["meta"] == {"i": index, "tags": ["x"] * index}
        assert row["cls"] == index
    with zerowait.Loader(path, 4, decode=decode,
                         map=lambda s: {"n": len(s["meta"]["tags"]), "txt": s["txt"]}) as loader:
        got = every_row(loader)
    assert {i: (int(r["n"]), r["txt"]) for i, r in got.items()} == {
        i: (i, rows[i]["txt"]) for i in range(10)}


def test_bad_utf8_or_json_is_a_corrupt_sample(tmp_path):
    rows = [{"__key__": f"k{i}", "meta": b"{not json" if i == 3 else json.dumps([i]),
             "txt": b"\xff\xfe" if i == 5 else f"t{i}", "blob": bytes([i]) * (i + 1)}
            for i in range(8)]
    path = write(tmp_path / "ds", rows)
    decode = {"meta": "json", "txt": "text"}
    with zerowait.Loader(path, 8, shuffle="none", decode=decode, keys=True) as loader:
        batches, errors = batches_and_errors(loader, zerowait.CorruptDataError)
    raised = [str(e) for e in errors]
    (kept,) = batches
    assert len(raised) == 2
    assert "sample 3" in raised[0] and "k3" in raised[0] and "not JSON" in raised[0]
    assert "sample 5" in raised[1] and "not UTF-8 text" in raised[1]
    assert kept["__index__"].tolist() == [0, 1, 2, 4, 6, 7]
    assert kept["__key__"] == ["k0", "k1", "k2", "k4", "k6", "k7"]
    offsets = kept["blob.offsets"].tolist()
    assert [bytes(kept["blob"][offsets[i]:offsets[i + 1]].numpy()) for i in range(6)] == [
        bytes([i]) * (i + 1) for i in (0, 1, 2, 4, 6, 7)]
    with zerowait.Loader(path, 8, decode=decode, on_corrupt="skip") as loader:
        assert sorted(every_row(loader)) == [0, 1, 2, 4, 6, 7]
        assert loader.stats()["skipped"] == 2
