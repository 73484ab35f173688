"""Loader(map=fn) in a container's small /dev/shm (64 MiB, Docker's default), for real: a
private mount namespace (unshare -m, which needs root: CI runs as root) mounts a 64 MiB tmpfs
over /dev/shm and runs tests/python/small_shm_map.py there over 16 MiB batches, 4 in flight.
A write into a full tmpfs would kill the process with SIGBUS; the stage falls back to $TMPDIR
(said and counted) or, with map_dir=, raises MapError naming the fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import zerowait

HERE = Path(__file__).parent
SAMPLE_BYTES = 2 << 20
SAMPLES = 48  # 6 batches of 8: 16 MiB of samples and 16 MiB of results each


@pytest.fixture(scope="module")
def large_samples(tmp_path_factory):
    rng = np.random.default_rng(11)
    blobs = [rng.integers(0, 256, SAMPLE_BYTES, dtype=np.uint8).tobytes() for _ in range(SAMPLES)]
    out = tmp_path_factory.mktemp("shm") / "ds"
    zerowait.write_dataset(({"__key__": f"s{i:02d}", "blob": b} for i, b in enumerate(blobs)),
                           out, shard_size=32 << 20)
    return out, {i: zlib.crc32(b[::-1]) for i, b in enumerate(blobs)}


def run_with_small_shm(tmp_path: Path, *args: str) -> dict:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("SKIPPED LOUDLY: mounting a small /dev/shm needs root and unshare(1) "
                    "(CI runs as root)")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs",
                            "-o", "size=1m", "tmpfs", "/dev/shm"], capture_output=True, text=True)
    if probe.returncode != 0:  # a container without CAP_SYS_ADMIN
        pytest.skip(f"SKIPPED LOUDLY: cannot mount a tmpfs in a private mount namespace here: "
                    f"{probe.stderr.strip()}")
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    command = ["unshare", "-m", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" "$@"',
               sys.executable, str(HERE / "small_shm_map.py"), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TMPDIR=str(tmpdir)))
    assert done.returncode == 0, f"exit {done.returncode} (-7 is SIGBUS)\n{done.stderr}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["shm_bytes"] == 64 << 20, "the tmpfs was not mounted over /dev/shm"
    assert report["shm_left"] == [], "the stage left files in /dev/shm"
    assert list(tmpdir.iterdir()) == [], "the stage left files in $TMPDIR"
    report["tmpdir"] = str(tmpdir)
    return report


def test_batches_larger_than_dev_shm_fall_back_to_tmpdir(large_samples, tmp_path):
    dataset, expected = large_samples
    report = run_with_small_shm(tmp_path, str(dataset))
    assert report["error"] is None
    assert {int(k): v for k, v in report["seen"].items()} == expected  # every sample, fn's result
    assert report["shared_dir"].startswith(report["tmpdir"] + "/zerowait-map-")
    assert report["shared_fallbacks"] > 0
    # Said once, with the fix.
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "/dev/shm" in report["warnings"][0] and "--shm-size" in report["warnings"][0]


def test_a_full_map_dir_is_an_error_naming_the_fix(large_samples, tmp_path):
    dataset, expected = large_samples
    report = run_with_small_shm(tmp_path, str(dataset), "/dev/shm")
    error = report["error"]
    assert error is not None, "64 MiB cannot hold 4 batches of 32 MiB"
    assert "/dev/shm" in error and "cannot hold" in error
    assert "--shm-size" in error and "map_dir" in error and "map_prefetch" in error
    assert report["warnings"] == []
    # What came before the error is right.
    assert all(expected[int(k)] == v for k, v in report["seen"].items())
