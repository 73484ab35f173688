"""zerowait.gds on a real GPU: file bytes read into CUDA tensors in every mode (cuFile where the
machine allows it, the POSIX path always) are the file's, bit for bit, at unaligned offsets and
sizes, past 1 GiB, from /dev/shm, and a dataset field's bytes of chosen samples; each reader says
which path it took. Marked ``gpu``: they skip, saying why, without a CUDA device
(scripts/gpu-check.sh runs them on the GPU machine)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import zerowait
from zerowait import gds

pytestmark = pytest.mark.gpu


def modes() -> list[str]:
    """off and auto always; on where cuFile can run here (elsewhere, on must fail saying why)."""
    return ["off", "auto"] + (["on"] if gds.evidence()["cufile_usable"] else [])


def on_gpu(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).cuda()


@pytest.fixture(scope="module")
def content(tmp_path_factory):
    path = tmp_path_factory.mktemp("gds") / "data.bin"
    data = np.random.default_rng(7).bytes((40 << 20) + 4321)
    path.write_bytes(data)
    return path, data


def test_evidence_and_the_path_each_mode_takes(content):
    path, _ = content
    found = gds.evidence()
    print("gds evidence:", found["summary"], found["facts"], "preload:", found["preload"])
    paths = {}
    for mode in modes():
        with gds.GdsReader(path, gds=mode) as reader:
            paths[mode] = reader.stats()
    print("paths:", {m: (s["path"], s["reason"]) for m, s in paths.items()})
    assert paths["off"]["path"] == "posix"
    if found["cufile_usable"]:
        assert paths["on"]["path"] == "cufile"
        assert paths["on"]["cufile_compat_mode"] == found["compat_mode"]
    else:
        with pytest.raises(zerowait.UnsupportedError, match="gds=on"):
            gds.GdsReader(path, gds="on")
        assert paths["auto"]["path"] == "posix" and paths["auto"]["gds_fallbacks"] == 1
    if not os.path.exists("/proc/driver/nvidia-fs") and found["cufile_usable"]:
        assert found["compat_mode"], "no nvidia-fs, yet cuFile is said to read directly"


@pytest.mark.parametrize("mode", ["off", "auto", "on"])
def test_unaligned_reads_are_bit_exact(content, mode):
    if mode not in modes():
        pytest.skip(f"cuFile cannot run here: {gds.evidence()['summary']}")
    path, data = content
    out = torch.zeros(len(data), dtype=torch.uint8, device="cuda")
    with gds.GdsReader(path, gds=mode) as reader:
        ranges = [(0, 1), (1, 4095), (4097, 8191), (12345, 9 << 20), (7, len(data) - 7)]
        for offset, nbytes in ranges:
            out.zero_()
            reader.read_into(out, offset, nbytes)
            assert torch.equal(out[:nbytes], on_gpu(data[offset:offset + nbytes])), (offset, nbytes)
            assert not out[nbytes:].any(), "bytes past nbytes were written"
        # A batch into two tensors, out of file order.
        a = torch.empty(5000, dtype=torch.uint8, device="cuda")
        b = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        reader.read_batch([(20 << 20, 3 << 20, b, 0), (3, 2000, a, 1), (100, 3000, a, 2001)])
        assert torch.equal(b, on_gpu(data[20 << 20:23 << 20]))
        assert torch.equal(a[1:2001], on_gpu(data[3:2003]))
        assert torch.equal(a[2001:5001], on_gpu(data[100:3100]))
        stats = reader.stats()
    moved = stats["cufile_bytes"] + stats["posix_bytes"]
    assert moved == 1 + 4095 + 8191 + (9 << 20) + len(data) - 7 + (3 << 20) + 5000
    if mode == "on":
        assert stats["path"] == "cufile" and stats["posix_bytes"] == 0


def test_a_gibibyte_and_more_into_a_bfloat16_tensor(tmp_path):
    size = (1 << 30) + 4096 * 3  # even: a whole number of bf16 elements
    data = np.random.default_rng(8).bytes(size)
    (tmp_path / "big.bin").write_bytes(data)
    expected = on_gpu(data)
    del data
    out = torch.empty(size // 2, dtype=torch.bfloat16, device="cuda")
    for mode in ("off", "on") if "on" in modes() else ("off",):
        zerowait.read_into(out, tmp_path / "big.bin", gds=mode)
        assert torch.equal(out.view(torch.uint8), expected), mode


def test_dev_shm_is_read_and_a_refused_o_direct_is_counted():
    path = f"/dev/shm/zerowait-gds-{os.getpid()}"
    data = np.random.default_rng(9).bytes((5 << 20) + 17)
    with open(path, "wb") as f:
        f.write(data)
    try:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
            refused = 0
        except OSError:
            refused = 1
        for mode in ("off", "auto"):
            out = torch.empty(len(data) - 17, dtype=torch.uint8, device="cuda")
            with gds.GdsReader(path, gds=mode) as reader:
                reader.read_into(out, 17)
                stats = reader.stats()
            assert torch.equal(out, on_gpu(data[17:])), mode
            assert stats["direct_fallbacks"] == refused, (mode, stats)
            if mode == "off":
                assert stats["direct"] == (refused == 0)
    finally:
        os.unlink(path)


def test_a_dataset_field_of_chosen_samples_lands_in_gpu_memory(tmp_path):
    rng = np.random.default_rng(10)
    rows = [{"bin": rng.bytes(1000 + 997 * i), "cls": str(i).encode()} for i in range(40)]
    zerowait.write_dataset(rows, tmp_path / "ds", shard_size=64 << 10)
    dataset = zerowait.Dataset(tmp_path / "ds")
    assert dataset.shard_count > 1
    indices = [5, 0, 39, 5, -1, 17]
    for mode in modes():
        reader = gds.DatasetDeviceReader(dataset, gds=mode)
        data, offsets = reader.read(indices, "bin")
        assert data.is_cuda and data.dtype == torch.uint8 and offsets.dtype == torch.int64
        for k, i in enumerate(indices):
            piece = data[int(offsets[k]):int(offsets[k + 1])]
            assert torch.equal(piece, on_gpu(dataset[i]["bin"])), (mode, i)
        assert reader.stats()["shards_open"] > 1
    labels, _ = zerowait.read_to_device(tmp_path / "ds", [3, 4], "cls")
    assert bytes(labels.cpu().numpy()) == b"34"
