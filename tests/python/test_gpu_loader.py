"""Loader(device="cuda") on a real GPU: batches bit-identical to the CPU loader's for every
decoder kind, page-locked arenas, no arena reused while its copy is in flight (a test that is
shown to catch such a race), preallocated ``out=`` buffers, and copies timed on the GPU.
Marked ``gpu``: they skip, saying why, without a CUDA device (scripts/gpu-check.sh runs them on
the GPU machine)."""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

import zerowait
import zerowait.device_copy

pytestmark = pytest.mark.gpu

# GPU cycles one copy is held back by, so that a copy still runs long after next() returned:
# about 50 ms at the H200's clock.
DELAY_CYCLES = 100_000_000


def wav_bytes(frames: np.ndarray, rate: int = 16_000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames.astype("<i2").tobytes())
    return out.getvalue()


def jpeg_bytes(rng: np.random.Generator, width: int, height: int) -> bytes:
    from PIL import Image

    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory) -> Path:
    """64 samples with a field for every decoder kind: JPEG, int, tokens, .npy array, audio,
    text, JSON, and raw bytes of 20-40 KB (large enough that batches keep them in the arena)."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(64):
        rows.append({
            "__key__": f"s{i:03d}",
            "jpg": jpeg_bytes(rng, 64 + i % 7 * 9, 48 + i % 5 * 11),
            "cls": str(i % 10).encode(),
            "tokens": rng.integers(0, 50_000, 20 + i % 30).astype("uint16").tobytes(),
            "npy": rng.random((3, 4)).astype("float32"),
            "wav": wav_bytes(rng.integers(-3000, 3000, 800 + i * 13)),
            "txt": f"sample {i}".encode(),
            "meta": json.dumps({"i": i, "even": i % 2 == 0}).encode(),
            "bin": rng.bytes(20_000 + i * 300),
        })
    path = tmp_path_factory.mktemp("every-kind") / "ds"
    zerowait.write_dataset(rows, path, shard_size=256 << 10)
    return path


DECODE = {"jpg": zerowait.RandomResizedCrop(32, flip=True), "cls": "int",
          "tokens": zerowait.TokenWindow(24, dtype="uint16"), "npy": zerowait.Array(),
          "wav": zerowait.AudioClip(1000, random_crop=True), "txt": "text", "meta": "json"}


def cpu_epoch(data: Path, **options) -> list:
    """Every batch of the CPU loader's epoch, tensors cloned so no arena stays held."""
    return [{n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in b.items()}
            for b in zerowait.Loader(data, **options)]


def assert_same_batch(cpu: dict, gpu: dict, where: str) -> None:
    assert cpu.keys() == gpu.keys(), where
    for name, value in cpu.items():
        other = gpu[name]
        if isinstance(value, torch.Tensor):
            assert other.is_cuda, f"{where}: {name} is not on the GPU"
            assert other.dtype == value.dtype and other.shape == value.shape, f"{where}: {name}"
            assert torch.equal(value, other.cpu()), f"{where}: {name} differs"
        else:
            assert value == other, f"{where}: {name}"


def test_every_decoder_kind_arrives_bit_identical_on_the_gpu(every_kind):
    options = dict(batch_size=12, seed=5, decode=DECODE, keys=True)
    cpu = cpu_epoch(every_kind, **options)
    with zerowait.Loader(every_kind, device="cuda", **options) as gpu:
        assert gpu.stats()["pinned"]
        batches = list(gpu)
    assert len(batches) == len(cpu) == 6
    for k, (a, b) in enumerate(zip(cpu, batches)):
        assert_same_batch(a, b, f"batch {k}")


def test_the_copies_read_page_locked_arenas(every_kind, monkeypatch):
    """Every column in the arena (not the small ones copied out of it) is page-locked memory,
    as cudaPointerGetAttributes tells torch's is_pinned()."""
    seen = []
    original = zerowait.device_copy.DeviceCopy.__call__

    def checking(self, batch):
        for name, value in batch.items():
            if isinstance(value, torch.Tensor) and value.numel() * value.element_size() > 64 << 10:
                seen.append((name, value.is_pinned()))
        return original(self, batch)

    monkeypatch.setattr(zerowait.device_copy.DeviceCopy, "__call__", checking)
    with zerowait.Loader(every_kind, batch_size=16, device="cuda", fields=["bin", "npy"]) as gpu:
        list(gpu)
    assert seen and all(pinned for _, pinned in seen), seen


class _ReleasingEarly(zerowait.device_copy.DeviceCopy):
    """A broken copy, the control: drops each host batch as soon as its copy is enqueued."""

    def __call__(self, batch):
        out = super().__call__(batch)
        self._in_flight.clear()
        return out


def _slowed_epoch(loader: zerowait.Loader, cpu: list) -> int:
    """Runs an epoch whose every copy starts ~50 ms late on the GPU (a sleep kernel on the copy
    stream), while the host drops batches at once and the pool is tiny: an arena given back
    before its copy ran is poisoned (or refilled) before the copy reads it. Returns how many
    batches differ from the CPU loader's."""
    differing = 0
    for k, want in enumerate(cpu):
        with torch.cuda.stream(loader._copy._stream):  # the test reaches in to slow the copy
            torch.cuda._sleep(DELAY_CYCLES)
        got = loader.next()
        same = all(torch.equal(want[n], got[n].cpu()) for n in want if isinstance(want[n],
                                                                               torch.Tensor))
        differing += not same
    assert loader.next() is None
    return differing


@pytest.mark.parametrize("copy_class", [zerowait.device_copy.DeviceCopy, _ReleasingEarly],
                         ids=["loader", "control-releasing-early"])
def test_no_arena_is_reused_while_its_copy_is_in_flight(every_kind, monkeypatch, copy_class):
    options = dict(batch_size=8, seed=2, fields=["bin", "jpg"],
                   decode={"jpg": zerowait.RandomResizedCrop(48)}, prefetch=1,
                   memory_budget=3 << 20, threads=1)
    cpu = cpu_epoch(every_kind, **options)
    monkeypatch.setattr(zerowait.loader, "DeviceCopy", copy_class)
    with zerowait.Loader(every_kind, device="cuda", poison_released=True, **options) as gpu:
        assert gpu.stats()["arenas"] <= 4, gpu.stats()["arenas"]
        differing = _slowed_epoch(gpu, cpu)
    if copy_class is _ReleasingEarly:
        assert differing > 0, "the control must show the race this test exists to catch"
    else:
        assert differing == 0


def test_out_buffers_are_filled_in_place_every_step(every_kind):
    options = dict(batch_size=10, seed=4, fields=["jpg", "cls"],
                   decode={"jpg": zerowait.CenterCrop(40), "cls": "int"})
    cpu = cpu_epoch(every_kind, **options)
    out = {"jpg": torch.empty(10, 40, 40, 3, dtype=torch.uint8, device="cuda"),
           "cls": torch.empty(10, dtype=torch.int64, device="cuda")}
    with zerowait.Loader(every_kind, device="cuda", out=out, **options) as gpu:
        for k, want in enumerate(cpu):
            got = gpu.next()
            assert got["jpg"].data_ptr() == out["jpg"].data_ptr(), f"batch {k}"
            n = want["cls"].shape[0]  # the last batch holds 4: the leading rows of out
            assert got["jpg"].shape[0] == n and got["cls"].shape[0] == n
            assert torch.equal(want["jpg"], got["jpg"].cpu()), f"batch {k}"
            assert torch.equal(want["cls"], got["cls"].cpu()), f"batch {k}"
            assert got["__index__"].is_cuda  # columns without a buffer get new tensors
    wrong = {"jpg": torch.empty(10, 40, 40, 3, dtype=torch.float32, device="cuda")}
    with zerowait.Loader(every_kind, device="cuda", out=wrong, **options) as gpu:
        with pytest.raises(ValueError, match=r"out\['jpg'\] is torch.float32"):
            gpu.next()
    small = {"jpg": torch.empty(4, 40, 40, 3, dtype=torch.uint8, device="cuda")}
    with zerowait.Loader(every_kind, device="cuda", out=small, **options) as gpu:
        with pytest.raises(ValueError, match=r"out\['jpg'\] has shape \(4, 40, 40, 3\)"):
            gpu.next()


def test_copies_are_timed_and_a_stalled_stream_counts_as_h2d(every_kind):
    options = dict(batch_size=16, seed=1, fields=["bin"], device="cuda")
    with zerowait.Loader(every_kind, **options) as gpu:
        prof = zerowait.StepProfiler(gpu, sample_system=False)
        for batch in prof.wrap(gpu):
            with prof.step():
                # The next copy starts late; the consumer's stream then waits for it.
                with torch.cuda.stream(gpu._copy._stream):
                    torch.cuda._sleep(DELAY_CYCLES)
                torch.cuda.current_stream().synchronize()
                assert batch["bin"].is_cuda
        prof.close()
        torch.cuda.synchronize()
        h2d = gpu.stats()["h2d"]
    expected_bytes = sum(
        sum(v.numel() * v.element_size() for v in b.values() if isinstance(v, torch.Tensor))
        for b in zerowait.Loader(every_kind, batch_size=16, seed=1, fields=["bin"]))
    assert h2d["batches"] == 4 and h2d["bytes"] == expected_bytes and h2d["pending"] == 0
    assert h2d["copy_s"] > 0 and h2d["gb_per_s"] > 0
    assert h2d["wait_s"] > 0, h2d
    assert gpu.h2d_wait_s == h2d["wait_s"]
    assert prof.summary()["seconds"]["h2d"] > 0, prof.summary()


def test_numa_auto_picks_the_gpus_node(every_kind):
    props = torch.cuda.get_device_properties(0)
    bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    node_file = Path("/sys/bus/pci/devices") / bus / "numa_node"
    sysfs_node = int(node_file.read_text()) if node_file.exists() else -1
    with zerowait.Loader(every_kind, batch_size=8, device="cuda", numa="auto") as gpu:
        numa = gpu.stats()["numa"]
        assert next(iter(gpu))["bin"].is_cuda
    if sysfs_node >= 0:
        assert numa["node"] == sysfs_node, numa
    else:  # a VM or one-node machine: nothing placed, and the reason names why
        assert numa["node"] is None and numa["reason"], numa
