"""Checkpoints mirrored to a real S3 server (Ceph RGW, started here by tests/s3/rgw.sh), restored
through Checkpointer.load() once the local copy is gone."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

import zerowait
from test_checkpoint import assert_same

REPO = Path(__file__).resolve().parents[2]
RGW = REPO / "tests" / "s3" / "rgw.sh"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """The server's AWS_* settings; skipped with the reason where it cannot run."""
    if shutil.which("radosgw") is None:
        pytest.skip("no radosgw: scripts/setup.sh installs Ceph's RADOS Gateway for these tests")
    if os.geteuid() != 0:
        pytest.skip("tests/s3/rgw.sh needs root to start Ceph's daemons")
    directory = tmp_path_factory.mktemp("s3") / "rgw"
    subprocess.run(["bash", str(RGW), "start", str(directory)], check=True, timeout=300,
                   stdin=subprocess.DEVNULL, capture_output=True)
    try:
        env = dict(line.split("=", 1) for line in (directory / "env").read_text().splitlines()
                   if "=" in line)
        yield env
    finally:
        subprocess.run(["bash", str(RGW), "stop", str(directory)], timeout=300,
                       stdin=subprocess.DEVNULL, capture_output=True)


@pytest.fixture()
def bucket(s3_server, monkeypatch) -> str:
    """A new bucket, with this process's environment pointing at the server."""
    for name, value in s3_server.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    name = "zw-" + uuid.uuid4().hex[:16]
    region = s3_server.get("AWS_REGION", "us-east-1")
    subprocess.run(
        ["curl", "-sS", "--fail", "-X", "PUT", f"{s3_server['AWS_ENDPOINT_URL']}/{name}",
         "--aws-sigv4", f"aws:amz:{region}:s3",
         "--user", f"{s3_server['AWS_ACCESS_KEY_ID']}:{s3_server['AWS_SECRET_ACCESS_KEY']}",
         # RGW wants the payload's hash, which curl signs but does not add by itself.
         "-H", f"x-amz-content-sha256: {hashlib.sha256(b'').hexdigest()}"],
        check=True, timeout=60, stdin=subprocess.DEVNULL, capture_output=True)
    return name


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
