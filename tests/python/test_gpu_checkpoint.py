"""Checkpoints of CUDA tensors on a real GPU: saved and restored onto the device bit for bit.
Marked ``gpu``: they skip, saying why, without a CUDA device (scripts/gpu-check.sh runs them)."""

from __future__ import annotations

import pytest
import torch

import zerowait
from test_checkpoint import assert_same

pytestmark = pytest.mark.gpu


@pytest.fixture()
def ckpt_dir(tmp_path):
    return tmp_path / "ckpt"


def test_cuda_tensors_save_and_load(ckpt_dir):
    state = {"w": torch.randn(64, 32, device="cuda"), "h": torch.randn(8, device="cuda").half(),
             "t": torch.randn(4, 4, device="cuda").t(), "cpu": torch.ones(2)}
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, state, blocking=True)
    assert_same(ckpt.load(map_location=None), state)
    on_cpu = ckpt.load()
    assert on_cpu["w"].device.type == "cpu" and torch.equal(on_cpu["w"], state["w"].cpu())
    target = {"w": torch.empty(64, 32, device="cuda"), "t": torch.empty(4, 4, device="cuda").t()}
    loaded = ckpt.load(into=target)
    assert loaded["w"] is target["w"] and torch.equal(target["w"], state["w"])
    assert torch.equal(target["t"], state["t"])
