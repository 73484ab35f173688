"""zerowait.gds where there is no GPU, or no cuFile: the mode's errors, the fallback it notes and
counts, the refusal of host memory, and the evidence it reports. The reads into GPU memory are
test_gpu_gds.py's (marked gpu)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import zerowait
from zerowait import gds


@pytest.fixture()
def data_file(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(np.random.default_rng(3).bytes(300_000))
    return path


@pytest.fixture()
def dataset(tmp_path):
    rows = [{"bin": bytes([i]) * (1000 + i), "cls": str(i).encode()} for i in range(12)]
    rows[7] = {"cls": b"7"}  # a sample without "bin"
    zerowait.write_dataset(rows, tmp_path / "ds")
    return tmp_path / "ds"


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


def test_evidence_reports_each_fact_and_a_summary():
    found = gds.evidence()
    assert isinstance(found["summary"], str) and found["summary"]
    assert {"library", "driver", "nvidia_fs", "nvfs_version", "cufile_json", "run_udev",
            "cuda"} <= set(found["facts"])
    assert isinstance(found["preload"], str) and found["preload"]
    if not found["cufile_usable"]:
        assert not found["compat_mode"]
        assert "cuFile" in found["summary"]


@no_cuda
def test_on_without_a_gpu_or_cufile_says_why(data_file):
    with pytest.raises(zerowait.UnsupportedError) as raised:
        gds.GdsReader(data_file, gds="on")
    message = str(raised.value)
    assert "gds=on" in message and str(data_file) in message
    assert "CUDA" in message or "libcufile" in message


@no_cuda
def test_auto_without_a_gpu_falls_back_to_posix_and_counts_it(data_file):
    with gds.GdsReader(data_file) as reader:
        stats = reader.stats()
        assert stats["path"] == "posix"
        assert stats["reason"].startswith("gds=auto: ")
        assert stats["gds_fallbacks"] == 1
        assert reader.size == 300_000
        # An address that is not GPU memory: refused, saying there is no GPU to read into.
        host = np.zeros(100, dtype=np.uint8)
        with pytest.raises(zerowait.UnsupportedError, match="no CUDA device"):
            reader._reader.read(host.ctypes.data, 100, 0)
    with gds.GdsReader(data_file, gds="off") as off:
        assert off.stats()["path"] == "posix" and off.stats()["gds_fallbacks"] == 0
        assert off.stats()["reason"] == "gds=off"


def test_host_tensors_and_bad_arguments_are_refused(data_file, tmp_path):
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        zerowait.read_into(torch.empty(10, dtype=torch.uint8), data_file, gds="off")
    with pytest.raises(zerowait.InvalidArgumentError, match="unknown gds mode 'yes'"):
        gds.GdsReader(data_file, gds="yes")
    with pytest.raises(zerowait.InvalidArgumentError, match="bounce_bytes"):
        gds.GdsReader(data_file, gds="off", bounce_bytes=1000)
    with pytest.raises(FileNotFoundError):
        gds.GdsReader(tmp_path / "missing", gds="off")
    with pytest.raises(TypeError):
        zerowait.read_into(b"bytes", data_file)
    reader = gds.GdsReader(data_file, gds="off")
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.stats()


def test_dataset_reads_name_missing_fields_and_refuse_remote_datasets(dataset):
    reader = gds.DatasetDeviceReader(zerowait.Dataset(dataset), gds="off")
    assert len(reader) == 12
    with pytest.raises(zerowait.InvalidArgumentError, match="has no field 'bin'"):
        reader.read([0, 7], "bin")
    with pytest.raises(IndexError):
        reader.read([12], "bin")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            reader.read([0, -1], "bin", device="cpu")
    with pytest.raises(zerowait.InvalidArgumentError, match="s3://bucket/ds"):
        gds.DatasetDeviceReader("s3://bucket/ds")


def test_the_wheel_preload_says_what_it_did(monkeypatch):
    monkeypatch.setattr(gds, "_preloaded", None)
    monkeypatch.setenv("ZEROWAIT_CUFILE_LIBRARY", "/elsewhere/libcufile.so.0")
    assert "ZEROWAIT_CUFILE_LIBRARY" in gds._preload_cufile()
    monkeypatch.setattr(gds, "_preloaded", None)
    monkeypatch.delenv("ZEROWAIT_CUFILE_LIBRARY")
    said = gds._preload_cufile()
    library, wheel = gds.wheel_library()
    if library is None:
        assert said == wheel and "nvidia-cufile" in said
    else:
        assert os.path.isfile(library) and library.endswith("libcufile.so.0")
        assert said == library or said.startswith(f"{library} (from {wheel}) does not load")
