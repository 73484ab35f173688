"""Checkpoints of CUDA tensors on a real GPU: saved and restored onto the device bit for bit, a
snapshot that in-place updates queued right after save() cannot tear, page-locked staging, into=
tensors filled in place, and damaged files reported. Marked ``gpu``: they skip, saying why,
without a CUDA device (scripts/gpu-check.sh runs them)."""

from __future__ import annotations

import pytest
import torch

import zerowait
from dist_checkpoint_worker import corrupt_tensor
from test_checkpoint import assert_same

pytestmark = pytest.mark.gpu

MiB = 1 << 20


@pytest.fixture()
def ckpt_dir(tmp_path):
    return tmp_path / "ckpt"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN-safe: compared as integers, on the GPU)."""
    if (a.dtype, a.shape) != (b.dtype, b.shape):
        return False
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(as_int), b.to(a.device).contiguous().view(as_int))


def delay_current_stream() -> None:
    """Queues some 0.1 s of GPU busy-waiting (2e8 clock cycles) on the current stream, so that
    work queued after it is still pending when the next call runs."""
    torch.cuda._sleep(200_000_000)


def test_cuda_tensors_save_and_load(ckpt_dir):
    state = {"w": torch.randn(64, 32, device="cuda"), "h": torch.randn(8, device="cuda").half(),
             "t": torch.randn(4, 4, device="cuda").t(), "cpu": torch.ones(2),
             "bf16": torch.randn(3, 7, device="cuda", dtype=torch.bfloat16)[:, ::2],
             "zero_d": torch.tensor(2.5, device="cuda"), "empty": torch.empty(0, 3, device="cuda"),
             "step": 7}
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, state, blocking=True)
    assert_same(ckpt.load(map_location=None), state)  # each tensor where it was saved from
    on_cpu = ckpt.load()
    assert on_cpu["w"].device.type == "cpu" and torch.equal(on_cpu["w"], state["w"].cpu())
    on_gpu = ckpt.load(map_location="cuda")
    assert on_gpu["cpu"].is_cuda and torch.equal(on_gpu["cpu"].cpu(), state["cpu"])
    target = {"w": torch.empty(64, 32, device="cuda"), "t": torch.empty(4, 4, device="cuda").t()}
    loaded = ckpt.load(into=target)
    assert loaded["w"] is target["w"] and torch.equal(target["w"], state["w"])
    assert torch.equal(target["t"], state["t"])


def test_states_of_several_gib_round_trip_bit_for_bit(ckpt_dir):
    """2 GiB of bf16 and 1 GiB of fp32 on the GPU (256 MiB tensors, like a large model's) plus a
    few small and odd ones, saved and restored to the GPU bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    bf16 = [torch.randn(128 * MiB, device="cuda", generator=gen).to(torch.bfloat16)
            for _ in range(8)]
    fp32 = [torch.randn(64 * MiB, device="cuda", generator=gen) for _ in range(4)]
    state = {"model": {f"layer.{i}": t for i, t in enumerate(bf16)},
             "optim": {f"exp_avg.{i}": t for i, t in enumerate(fp32)},
             "odd": [torch.randn(1000, 3, device="cuda")[:, 1], torch.tensor(1, device="cuda"),
                     torch.empty(0, device="cuda", dtype=torch.bfloat16), torch.arange(5)]}
    device_bytes = sum(t.numel() * t.element_size() for t in bf16 + fp32) + 1000 * 4 + 8
    ckpt = zerowait.Checkpointer(ckpt_dir)
    result = ckpt.save(1, state).wait()
    assert result["committed"] and result["device_bytes"] == device_bytes
    assert result["device_copy_s"] > 0
    for location in (None, "cuda"):
        loaded = ckpt.load(map_location=location)
        for i, t in enumerate(bf16):
            assert loaded["model"][f"layer.{i}"].is_cuda
            assert same_bits(loaded["model"][f"layer.{i}"], t), f"layer.{i}"
        for i, t in enumerate(fp32):
            assert same_bits(loaded["optim"][f"exp_avg.{i}"], t), f"exp_avg.{i}"
        for i, t in enumerate(state["odd"]):
            assert same_bits(loaded["odd"][i], t), f"odd[{i}]"
        del loaded


def test_a_snapshot_is_ordered_after_pending_writes_and_before_later_ones(ckpt_dir):
    """Writes queued before save() are in the snapshot; in-place updates queued right after it
    returns (as an optimizer step would be) are not, although the copies had not run yet when
    they were queued: without the ordering on the caller's stream the copy would read a mix."""
    weights = [torch.full((64 * MiB,), 1.0, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    ckpt = zerowait.Checkpointer(ckpt_dir)
    for step, before in ((1, 2.0), (2, 4.0)):  # the second save reuses the staging pool
        delay_current_stream()
        for w in weights:
            w.mul_(2)  # pending when save() runs: must be in the snapshot
        handle = ckpt.save(step, {"w": weights})
        for w in weights:
            w.add_(1000)  # queued at once: must not reach the snapshot
        handle.wait()
        assert all(torch.equal(w, torch.full_like(w, before + 1000)) for w in weights)
        for w in weights:
            w.sub_(1000)
        loaded = ckpt.load(step=step, map_location="cuda")["w"]
        for i, t in enumerate(loaded):
            assert torch.equal(t, torch.full_like(t, before)), f"step {step} tensor {i} is torn"


def test_staging_is_page_locked(ckpt_dir, monkeypatch):
    """The staging bytes CUDA tensors are copied into are pinned (torch's is_pinned, which asks
    cudaPointerGetAttributes)."""
    import zerowait._checkpoint_device as device

    real_view = device._staging_view
    pinned = []

    def checked_view(torch_module, address, nbytes):
        view = real_view(torch_module, address, nbytes)
        pinned.append(view.is_pinned())
        return view

    monkeypatch.setattr(device, "_staging_view", checked_view)
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, {"a": torch.randn(MiB, device="cuda"), "b": torch.randn(7, device="cuda")},
              blocking=True)
    assert pinned == [True, True]


def test_into_preallocated_cuda_tensors_fills_them_in_place_after_pending_work(ckpt_dir):
    state = {"w": torch.randn(1024, 1024, device="cuda"),
             "t": torch.randn(512, 256, device="cuda").t(),
             "b": torch.randn(4096, device="cuda").to(torch.bfloat16)}
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, state, blocking=True)
    target = {"w": torch.zeros(1024, 1024, device="cuda"),
              "t": torch.zeros(512, 256, device="cuda").t(),
              "b": torch.zeros(4096, device="cuda", dtype=torch.bfloat16)}
    pointers = {k: v.data_ptr() for k, v in target.items()}
    delay_current_stream()
    for t in target.values():
        t.fill_(9)  # still queued when load() starts: the restore must land after it
    loaded = ckpt.load(into=target)
    for key, t in state.items():
        assert loaded[key] is target[key] and target[key].data_ptr() == pointers[key]
        assert same_bits(target[key], t), key


def test_restore_to_the_gpu_verifies_checksums(ckpt_dir):
    state = {"model": {f"layer.{i}": torch.randn(MiB, device="cuda") for i in range(3)}}
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, state, blocking=True)
    corrupt_tensor(ckpt_dir, 1, "/model/layer.1")
    with pytest.raises(zerowait.CorruptDataError, match="layer.1"):
        ckpt.load(step=1, map_location="cuda")
    target = {"model": {f"layer.{i}": torch.empty(MiB, device="cuda") for i in range(3)}}
    with pytest.raises(zerowait.CorruptDataError, match="layer.1"):
        ckpt.load(step=1, into=target)
