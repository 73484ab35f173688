"""Shared fixtures: real trees of files on disk, packed with the public API, and a real S3
server."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
import uuid
from pathlib import Path

import pytest

import zerowait
from cluster import make_cluster  # noqa: F401  (the fixture: N nodes on this host)
from helpers import create_bucket, write_random_tree

# Remote data is cached by default (docs/cache.md): every process the tests start caches into a
# directory of this session's own, never into the user's ~/.cache/zerowait. Tests that set
# XDG_CACHE_HOME or HOME themselves still decide for their own processes.
os.environ.pop("ZEROWAIT_CACHE_DIR", None)
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="zerowait-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)


def _cuda_absent_reason() -> str:
    """Why the tests marked ``gpu`` cannot run here ("" when a CUDA device is there)."""
    try:
        import torch
    except ImportError:
        return "no torch: the GPU tests need a CUDA build of torch and a CUDA device"
    if torch.cuda.is_available():
        return ""
    return (f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}): "
            "scripts/gpu-check.sh runs this on the GPU machine")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, with the reason, where there is no CUDA device. Under
    pytest-xdist (``-n 3 --dist loadgroup``, as scripts/test.sh runs on 2 cores), the tests that use the S3
    server run on one worker, which starts it once."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = _cuda_absent_reason() if gpu_tests else ""
    for item in gpu_tests if reason else []:
        item.add_marker(pytest.mark.skip(reason=reason))
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("s3"))


@pytest.fixture(scope="session")
def cli() -> Path:
    """The `zerowait` command that `pip install .` put beside this interpreter, or the one
    $ZEROWAIT_CLI names (a development build)."""
    path = Path(os.environ.get("ZEROWAIT_CLI") or Path(sysconfig.get_path("scripts")) / "zerowait")
    if not os.access(path, os.X_OK):
        pytest.fail(f"the zerowait command is not installed at {path}; run `pip install .`")
    return path


@pytest.fixture()
def ground_truth(request):
    """record(figure, planted, measured, within=T or relative=R): a diagnostic figure beside
    the truth planted for it and the tolerance its test allows (T absolute, or a pair (below,
    above) where the test allows more on one side; R a fraction of the truth), appended as a
    JSON line to the file $ZEROWAIT_GROUND_TRUTH names; scripts/ground-truth.sh prints them as
    a table. Called before the test's own assertion, so that a figure outside its tolerance is
    on record too."""
    def record(figure: str, planted: float, measured: float, *,
               within: float | tuple[float, float] | None = None,
               relative: float | None = None) -> None:
        if within is None:
            below = above = relative * planted
            tolerance = f"±{relative:.0%}"
        else:
            below, above = within if isinstance(within, tuple) else (within, within)
            tolerance = f"±{below:.3g}" if below == above else f"-{below:.3g}/+{above:.3g}"
        row = {"test": request.node.nodeid, "figure": figure, "planted": planted,
               "measured": measured, "tolerance": tolerance,
               "ok": planted - below <= measured <= planted + above}
        path = os.environ.get("ZEROWAIT_GROUND_TRUTH")
        if path:
            with open(path, "a") as out:
                out.write(json.dumps(row) + "\n")
    return record


@pytest.fixture(scope="session")
def image_tree(tmp_path_factory) -> Path:
    """A small synthetic ImageFolder tree of real JPEGs (3 classes, 48 files)."""
    root = tmp_path_factory.mktemp("images")
    report = zerowait.generate_imagefolder(
        root, files=48, classes=3, seed=7, min_bytes=1500, max_bytes=5000
    )
    assert report["files"] == 48
    return root


@pytest.fixture(scope="session")
def image_dataset(image_tree, tmp_path_factory) -> Path:
    """image_tree packed with imagefolder=True into a few small shards."""
    out = tmp_path_factory.mktemp("image-shards")
    zerowait.pack(image_tree, out, imagefolder=True, shard_size=64 * 1024, sync=False)
    return out


@pytest.fixture()
def random_tree(tmp_path) -> tuple[Path, dict[str, dict[str, bytes]]]:
    root = tmp_path / "files"
    return root, write_random_tree(root, samples=40, seed=11)


REPO = Path(__file__).resolve().parents[2]
RGW = REPO / "tests" / "s3" / "rgw.sh"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (Ceph RGW, started by tests/s3/rgw.sh) for the whole session: its AWS_*
    settings; skipped with the reason where it cannot run."""
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
    create_bucket(s3_server, name)
    return name


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: a multi-process proof that takes about a minute on 2 cores "
        "(deselect with -m 'not slow')")
