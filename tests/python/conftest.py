"""Shared fixtures: real trees of files on disk, packed with the public API."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

import zerowait
from helpers import write_random_tree


@pytest.fixture(scope="session")
def cli() -> Path:
    """The `zerowait` command that `pip install .` put beside this interpreter."""
    path = Path(sysconfig.get_path("scripts")) / "zerowait"
    if not os.access(path, os.X_OK):
        pytest.fail(f"the zerowait command is not installed at {path}; run `pip install .`")
    return path


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
