"""load() reads a tensor file the page cache already holds through the cache (not O_DIRECT), and
one it does not hold with O_DIRECT: both restore every tensor bit for bit and both name a
damaged tensor."""

from pathlib import Path

import pytest
import torch

import zerowait
from zerowait import _core
from helpers import flip_byte


def tensor_files(directory: Path) -> list:
    return sorted(str(p) for p in directory.glob("step-*/*.safetensors"))


def read_through_cache(paths) -> None:
    for path in paths:
        Path(path).read_bytes()


@pytest.mark.parametrize("resident", [True, False])
def test_resident_and_evicted_files_restore_and_verify(tmp_path, resident):
    g = torch.Generator().manual_seed(4)
    state = {"w": torch.randn(300_000, generator=g), "b": torch.randn(33, generator=g).half()}
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    ckpt.save(1, state, blocking=True)
    paths = tensor_files(tmp_path / "ckpt")
    size = sum(Path(p).stat().st_size for p in paths)
    if resident:
        read_through_cache(paths)
    else:
        _core.evict_from_page_cache(paths)
    in_cache = _core.page_cache_residency(paths)["resident_bytes"]
    assert (in_cache >= 0.9 * size) if resident else (in_cache < 0.9 * size)
    loaded = ckpt.load(1)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])

    manifest = _core._CheckpointReader(str(tmp_path / "ckpt"), 1, 0).manifest()
    w = next(t for t in manifest["tensors"] if t["name"] == "/w")
    flip_byte(tmp_path / "ckpt" / w["file"], w["offset"] + 12345)
    if resident:
        read_through_cache(paths)
    else:
        _core.evict_from_page_cache(paths)
    with pytest.raises(zerowait.CorruptDataError, match="tensor '/w'"):
        ckpt.load(1)
    ckpt.close()
