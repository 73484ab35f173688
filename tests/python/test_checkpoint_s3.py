"""Checkpoints mirrored to a real S3 server (Ceph RGW, started by the s3_server fixture of
conftest.py), restored through Checkpointer.load() once the local copy is gone."""

from __future__ import annotations

import shutil

import pytest
import torch

import zerowait
from test_checkpoint import assert_same


def training_state(step: int) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {"model": {f"layer.{i}.weight": torch.randn(256, 256, generator=generator)
                      for i in range(4)},
            "optimizer": {"lr": 0.1 / step, "betas": (0.9, 0.999)},
            "step": step}


def test_a_step_mirrored_to_the_bucket_loads_exactly_once_the_local_copy_is_gone(tmp_path,
                                                                                 bucket):
    mirror = f"s3://{bucket}/runs/7"
    with zerowait.Checkpointer(tmp_path / "local", mirror=mirror, keep_last=2) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, training_state(step))
        ckpt.wait()
    with zerowait.Checkpointer(mirror) as in_the_bucket:
        assert in_the_bucket.steps() == [2, 3]  # the mirror keeps the newest two, as asked

    shutil.rmtree(tmp_path / "local")
    # The same run resuming on a node whose local disk is empty.
    with zerowait.Checkpointer(tmp_path / "local", mirror=mirror, run_id=ckpt.run_id) as resumed:
        with pytest.warns(UserWarning, match="loading the mirror's copy in s3://"):
            assert_same(resumed.load(), training_state(3))
        assert resumed.loaded_step == 3
        with pytest.warns(UserWarning, match="loading the mirror's copy in s3://"):
            assert_same(resumed.load(2), training_state(2))
