"""Checkpointer.load(mmap=True): new CPU tensors are views of private mappings of the step's
files, each verified where it is mapped; everything else is read as without it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import zerowait
from dist_checkpoint_worker import corrupt_tensor


def file_mappings() -> dict:
    """path -> [(start, end, permissions)] of this process's file mappings."""
    maps: dict = {}
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                maps.setdefault(fields[5], []).append((start, end, fields[1]))
    return maps


def mapped_file(tensor: torch.Tensor) -> str:
    """The file whose mapping holds all of `tensor`'s bytes, or ""."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    for path, ranges in file_mappings().items():
        if any(lo <= start and end <= hi for lo, hi, _ in ranges):
            return path
    return ""


def state() -> dict:
    g = torch.Generator().manual_seed(11)
    return {
        "model": {"w": torch.nn.Parameter(torch.randn(64, 32, generator=g)),
                  "b": torch.randn(32, generator=g).to(torch.bfloat16),
                  "ids": torch.arange(1000, dtype=torch.int64)},
        "optim": {"state": {0: {"exp_avg": torch.randn(64, 32, generator=g)}}, "lr": 1e-3},
        "odd": torch.ones(3, dtype=torch.uint8),    # 3 bytes: the next tensor's offset is odd
        "after": torch.arange(7, dtype=torch.int16),
        "empty": torch.empty(0),
        "step": 12,
    }


def tensors(tree, prefix=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from tensors(value, f"{prefix}/{key}")
    elif isinstance(tree, torch.Tensor):
        yield prefix, tree


def assert_same(loaded, saved) -> None:
    got, want = dict(tensors(loaded)), dict(tensors(saved))
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert type(got[name]) is type(tensor), name
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor.detach()), name
    assert loaded["optim"]["lr"] == saved["optim"]["lr"] and loaded["step"] == saved["step"]


def test_new_cpu_tensors_view_the_files_pages_and_equal_what_load_reads(tmp_path):
    saved = state()
    with zerowait.Checkpointer(tmp_path) as ckpt:
        ckpt.save(5, saved, blocking=True)
    read = zerowait.Checkpointer(tmp_path).load()
    mapped = zerowait.Checkpointer(tmp_path).load(mmap=True)
    assert_same(read, saved)
    assert_same(mapped, saved)
    assert mapped["model"]["w"].requires_grad

    step_files = {str(p.resolve()) for p in (tmp_path / "step-5").glob("*.safetensors")}
    where = {name: mapped_file(t) for name, t in tensors(mapped) if t.numel()}
    for name in ("/model/w", "/model/b", "/model/ids", "/optim/state/0/exp_avg", "/odd"):
        assert where[name] in step_files, (name, where)
    # Not aligned for its dtype in the file (after 3 bytes): read into memory of its own.
    assert where["/after"] == ""
    assert all(mapped_file(t) == "" for _, t in tensors(read) if t.numel())
    # The mapping is private: it may be written, copy on write.
    maps = file_mappings()[where["/model/w"]]
    assert all(perms.startswith("rw") and perms.endswith("p") for _, _, perms in maps)


def test_writing_a_mapped_tensor_changes_neither_the_file_nor_another_load(tmp_path):
    saved = state()
    with zerowait.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, saved, blocking=True)
    files = {p: p.read_bytes() for p in (tmp_path / "step-1").iterdir()}
    first = zerowait.Checkpointer(tmp_path).load(mmap=True)
    second = zerowait.Checkpointer(tmp_path).load(mmap=True)
    with torch.no_grad():
        first["model"]["w"].add_(1.0)
        first["model"]["ids"].zero_()
    assert torch.equal(second["model"]["w"], saved["model"]["w"].detach())
    assert torch.equal(second["model"]["ids"], saved["model"]["ids"])
    assert {p: p.read_bytes() for p in files} == files


def test_a_mapped_tensor_that_is_damaged_is_named_and_an_older_step_loaded(tmp_path):
    saved = state()
    with zerowait.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, saved, blocking=True)
        newer = {**saved, "step": 13}
        ckpt.save(2, newer, blocking=True)
    damaged = corrupt_tensor(tmp_path, 2, "/model/ids")

    with pytest.raises(zerowait.CorruptDataError) as error:
        zerowait.Checkpointer(tmp_path).load(2, mmap=True, fallback=False)
    assert "tensor '/model/ids'" in str(error.value) and damaged in str(error.value)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = zerowait.Checkpointer(tmp_path)
        loaded = ckpt.load(mmap=True)
    assert ckpt.loaded_step == 1 and loaded["step"] == 12
    assert any("'/model/ids'" in str(w.message) and "falling back to step 1" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    assert_same(loaded, saved)


def test_a_damaged_primary_copy_gives_the_mirrors_mapped_copy(tmp_path):
    saved = state()
    mirror = tmp_path / "mirror"
    with zerowait.Checkpointer(tmp_path / "primary", mirror=mirror) as ckpt:
        ckpt.save(3, saved, blocking=True)
        ckpt.wait()
    corrupt_tensor(tmp_path / "primary", 3, "/model/w")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        loaded = zerowait.Checkpointer(tmp_path / "primary", mirror=mirror).load(3, mmap=True)
    assert_same(loaded, saved)
    assert mapped_file(loaded["model"]["w"]).startswith(str(mirror.resolve()))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_incremental_and_compressed_steps_load_alike_with_and_without_mmap(tmp_path, compression):
    saved = state()
    with zerowait.Checkpointer(tmp_path, compression=compression, incremental=True) as ckpt:
        ckpt.save(1, saved, blocking=True)
        changed = {**saved, "odd": torch.full((3,), 9, dtype=torch.uint8)}
        ckpt.save(2, changed, blocking=True)  # the unchanged tensors stay in step 1's file
    mapped = zerowait.Checkpointer(tmp_path).load(2, mmap=True)
    assert_same(mapped, changed)
    where = mapped_file(mapped["model"]["ids"])
    if compression is None:
        assert where == str((tmp_path / "step-1").resolve() / Path(where).name), where
    else:
        assert where == ""  # compressed: decompressed into memory of its own


def test_into_targets_are_filled_in_place_and_cuda_locations_are_not_mapped(tmp_path):
    saved = state()
    with zerowait.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, saved, blocking=True)
    into = {"model": {"w": torch.zeros(64, 32)}}
    loaded = zerowait.Checkpointer(tmp_path).load(into=into, mmap=True)
    assert loaded["model"]["w"] is into["model"]["w"]
    assert torch.equal(into["model"]["w"], saved["model"]["w"].detach())
    assert mapped_file(into["model"]["w"]) == ""
    assert mapped_file(loaded["model"]["ids"]) != ""


def test_a_missing_file_is_named_and_the_step_maps_once_it_is_back(tmp_path):
    saved = state()
    with zerowait.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, saved, blocking=True)
    (part,) = (tmp_path / "step-1").glob("*.safetensors")
    moved = part.with_suffix(".moved")
    part.rename(moved)
    with pytest.raises(zerowait.ZerowaitError, match=part.name):
        zerowait.Checkpointer(tmp_path).load(1, mmap=True, fallback=False)
    moved.rename(part)
    loaded = zerowait.Checkpointer(tmp_path).load(1, mmap=True)
    assert_same(loaded, saved)
    assert mapped_file(loaded["model"]["ids"]) == str(part.resolve())
