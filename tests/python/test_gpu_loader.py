"""Loader(device="cuda") on a real GPU: batches bit-identical to the CPU loader's, page-locked
arenas, and no arena reused while its copy is in flight. Marked ``gpu``: they skip, saying why,
without a CUDA device (scripts/gpu-check.sh runs them on the GPU machine)."""

from __future__ import annotations

import pytest
import torch

import zerowait

pytestmark = pytest.mark.gpu


def test_device_cuda_delivers_the_same_batches_on_the_gpu(image_dataset):
    decode = {"cls": "int", "jpg": zerowait.RandomResizedCrop(64)}
    cpu = list(zerowait.Loader(image_dataset, batch_size=8, seed=1, decode=decode))
    gpu = zerowait.Loader(image_dataset, batch_size=8, seed=1, decode=decode, device="cuda")
    assert gpu.stats()["pinned"]
    for a, b in zip(cpu, gpu):
        assert b["jpg"].is_cuda and torch.equal(a["jpg"], b["jpg"].cpu())
        assert torch.equal(a["cls"], b["cls"].cpu())
