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


def cufile_reads(path) -> str:
    """"" when gds="on" reads ``path`` here (a reader opens and a first read into GPU memory
    works), else what failed."""
    try:
        with gds.GdsReader(path, gds="on") as reader:
            probe = torch.empty(4096, dtype=torch.uint8, device="cuda")
            reader.read_into(probe, 0, min(4096, reader.size))
    except zerowait.ZerowaitError as e:
        return f"{type(e).__name__}: {e}"
    return ""


def modes(path) -> list[str]:
    """off and auto always; on where cuFile reads (elsewhere the evidence test checks on)."""
    return ["off", "auto"] + (["on"] if cufile_reads(path) == "" else [])


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
    why = cufile_reads(path)
    print("gds=on here:", why or "reads through cuFile")
    if not os.path.exists("/proc/driver/nvidia-fs") and found["cufile_usable"]:
        assert found["compat_mode"], "no nvidia-fs, yet cuFile is said to read directly"
    probe = torch.empty(4096, dtype=torch.uint8, device="cuda")
    stats = {}
    for mode in ("off", "auto"):
        with gds.GdsReader(path, gds=mode) as reader:
            reader.read_into(probe)
            stats[mode] = reader.stats()
    print("paths:", {m: (s["path"], s["reason"]) for m, s in stats.items()})
    assert stats["off"]["path"] == "posix" and stats["off"]["gds_fallbacks"] == 0
    if why:
        assert "cuFile" in why or "CUDA" in why, why  # loud and specific
        assert not found["cufile_usable"] or "cuFile" in why
        # auto does not fail where on does: the POSIX path, said and counted.
        assert stats["auto"]["path"] == "posix" and stats["auto"]["gds_fallbacks"] == 1
    else:
        with gds.GdsReader(path, gds="on") as reader:
            reader.read_into(probe)
            on = reader.stats()
        assert on["path"] == "cufile" and on["cufile_bytes"] == 4096
        assert on["cufile_compat_mode"] == found["compat_mode"]


@pytest.mark.parametrize("mode", ["off", "auto", "on"])
def test_unaligned_reads_are_bit_exact(content, mode):
    path, data = content
    if mode not in modes(path):
        pytest.skip(f"cuFile does not read here: {cufile_reads(path)}")
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
    for mode in ("off", "on") if "on" in modes(tmp_path / "big.bin") else ("off",):
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
    for mode in modes(dataset.shards[0]["path"]):
        reader = gds.DatasetDeviceReader(dataset, gds=mode)
        data, offsets = reader.read(indices, "bin")
        assert data.is_cuda and data.dtype == torch.uint8 and offsets.dtype == torch.int64
        for k, i in enumerate(indices):
            piece = data[int(offsets[k]):int(offsets[k + 1])]
            assert torch.equal(piece, on_gpu(dataset[i]["bin"])), (mode, i)
        assert reader.stats()["shards_open"] > 1
    labels, _ = zerowait.read_to_device(tmp_path / "ds", [3, 4], "cls")
    assert bytes(labels.cpu().numpy()) == b"34"
