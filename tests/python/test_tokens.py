"""Token sequences for language-model training: documents stored as little-endian token arrays
come out of the Loader as fixed-length int64 rows (padded or cut, lengths beside them), with
random offsets that repeat after an exact resume and whatever the thread count; documents packed
at write time (zerowait.token_windows) come back as the concatenated stream, cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zerowait


def documents(count: int, seed: int, vocab: int = 50_000, longest: int = 40) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(1, longest), dtype=np.int64)
            for _ in range(count)]


def rows_of(path, window, **options) -> tuple[list, list]:
    loader = zerowait.Loader(path, batch_size=7, shuffle="none", fields=["tokens"],
                             decode={"tokens": window}, **options)
    rows, lengths = [], []
    for batch in loader:
        rows += batch["tokens"].tolist()
        lengths += batch["tokens.lengths"].tolist()
    return rows, lengths


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "int32"])
def test_each_document_becomes_one_row_padded_or_cut(tmp_path, dtype):
    docs = documents(50, seed=1, vocab=30_000 if dtype != "int32" else 2**31 - 1)
    zerowait.write_dataset(({"tokens": d.astype(dtype).tobytes()} for d in docs), tmp_path / "ds",
                           shard_size=4 << 10)
    window = zerowait.TokenWindow(16, dtype=dtype, pad=-100)
    rows, lengths = rows_of(tmp_path / "ds", window)
    assert len(rows) == len(docs)
    for doc, row, length in zip(docs, rows, lengths):
        kept = doc[:16].tolist()
        assert length == len(kept)
        assert row == kept + [-100] * (16 - len(kept))


def test_int32_rows_hold_the_same_tokens_in_half_the_bytes(tmp_path):
    docs = documents(30, seed=5)
    docs[7][0] = 2**31 + 5  # fits uint32 on disk, not an int32 row
    zerowait.write_dataset(({"tokens": d.astype("uint32").tobytes()} for d in docs),
                           tmp_path / "ds")
    wide = zerowait.TokenWindow(16, dtype="uint32", pad=-1)
    narrow = zerowait.TokenWindow(16, dtype="uint32", pad=-1, out_dtype="int32")
    assert narrow.out_dtype == "int32" and "out_dtype='int32'" in repr(narrow)
    loader = zerowait.Loader(tmp_path / "ds", batch_size=7, shuffle="none", fields=["tokens"],
                             decode={"tokens": narrow}, on_corrupt="skip")
    batches = list(loader)
    assert {b["tokens"].dtype for b in batches} == {torch.int32}
    rows = [row for b in batches for row in b["tokens"].tolist()]
    expected, _ = rows_of(tmp_path / "ds", wide)
    assert rows == expected[:7] + expected[8:]  # document 7 is skipped: its token does not fit
    assert loader.stats()["skipped"] == 1
    with pytest.raises(ValueError, match="out_dtype"):
        zerowait.TokenWindow(8, out_dtype="int16")
    with pytest.raises(ValueError, match="does not fit int32"):
        zerowait.TokenWindow(8, pad=2**40, out_dtype="int32")


def test_random_offsets_are_windows_of_the_document_and_repeat_after_a_resume(tmp_path):
    docs = documents(60, seed=2, longest=100)
    zerowait.write_dataset(({"tokens": d.astype("uint16").tobytes()} for d in docs),
                           tmp_path / "ds", shard_size=4 << 10)
    window = zerowait.TokenWindow(8, random_offset=True)

    def epoch(threads, epoch_number=0, skip=0):
        loader = zerowait.Loader(tmp_path / "ds", batch_size=5, shuffle="random", seed=3,
                                 epoch=epoch_number, threads=threads, fields=["tokens"],
                                 decode={"tokens": window})
        it = iter(loader)
        for _ in range(skip):
            next(it)
        state = loader.state_dict()
        return [(int(i), row) for b in it
                for i, row in zip(b["__index__"], b["tokens"].tolist())], state

    one, _ = epoch(threads=1)
    two, _ = epoch(threads=2)
    assert one == two  # the same windows whatever the thread count
    for index, row in one:
        doc = docs[index].tolist()
        if len(doc) <= 8:
            assert row == doc + [0] * (8 - len(doc))
        else:
            starts = [s for s in range(len(doc) - 7) if doc[s:s + 8] == row]
            assert starts, f"row of sample {index} is not a window of it"
    long_docs = {i for i, d in enumerate(docs) if len(d) > 20}
    offsets_vary = {tuple(row) for i, row in one if i in long_docs}
    assert len(offsets_vary) == len([i for i, _ in one if i in long_docs])

    # Resuming mid-epoch from a saved state gives the same rows for the rest of the epoch.
    rest, state = epoch(threads=2, skip=4)
    resumed = zerowait.Loader(tmp_path / "ds", batch_size=5, shuffle="random", seed=3,
                              fields=["tokens"], decode={"tokens": window})
    resumed.load_state_dict(state)
    again = [(int(i), row) for b in resumed
             for i, row in zip(b["__index__"], b["tokens"].tolist())]
    assert again == rest == one[20:]

    # Another epoch draws other offsets.
    other, _ = epoch(threads=1, epoch_number=1)
    assert dict(other) != dict(one)


def test_documents_packed_at_write_time_read_back_as_the_cut_stream(tmp_path):
    docs = documents(80, seed=4)
    report = zerowait.write_dataset(zerowait.token_windows(docs, 32, eos=50_256), tmp_path / "ds",
                                    shard_size=8 << 10)
    stream = np.concatenate([np.append(d, 50_256) for d in docs])
    expected = stream[: len(stream) // 32 * 32].reshape(-1, 32)
    assert report["samples"] == len(expected)
    rows, lengths = rows_of(tmp_path / "ds", zerowait.TokenWindow(32))
    assert torch.tensor(rows).equal(torch.from_numpy(expected))
    assert set(lengths) == {32}  # packed rows carry no padding

    tail = list(zerowait.token_windows(docs, 32, eos=50_256, drop_last=False))[-1]["tokens"]
    assert np.frombuffer(tail, dtype="<u2").tolist() == stream[len(expected) * 32:].tolist()
    with pytest.raises(ValueError, match="outside uint16"):
        list(zerowait.token_windows([[70_000]], 4))


def test_a_field_that_is_not_whole_tokens_is_named_and_skipped_as_asked(tmp_path):
    samples = [{"__key__": f"doc{i}", "tokens": np.arange(i + 2, dtype="<u2").tobytes()}
               for i in range(6)]
    samples[3]["tokens"] += b"\x01"  # 11 bytes: not whole uint16 tokens
    zerowait.write_dataset(samples, tmp_path / "ds")
    window = zerowait.TokenWindow(4)
    with pytest.raises(zerowait.CorruptDataError,
                       match="key 'doc3'.*'tokens' holds 11 bytes, not a whole number of uint16"):
        rows_of(tmp_path / "ds", window)
    rows, _ = rows_of(tmp_path / "ds", window, on_corrupt="skip")
    assert len(rows) == 5
    with pytest.raises(ValueError, match="seq_len"):
        zerowait.TokenWindow(0)
    with pytest.raises(ValueError, match="uint16, uint32 or int32"):
        zerowait.TokenWindow(8, dtype="float32")
