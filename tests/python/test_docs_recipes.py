"""The docs' torchvision recipes, run as written: the code blocks of docs/loader-migration.md's
"Recipe: torchvision v2 augmentations through `map`" and docs/loader.md's "Per-sample Python",
with only their example paths pointed at a generated tree and its shards and their worker counts
made small. A recipe that no longer runs (an API change, a torchvision beside a torch it was not
built for) fails here, not for the user who copies it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import zerowait

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def section_blocks(doc: str, heading: str) -> list[str]:
    """The python code blocks of the section under `heading` in docs/`doc`."""
    text = (REPO / "docs" / doc).read_text()
    assert heading in text, f"docs/{doc} has no section {heading!r}"
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return BLOCK.findall(section)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    zerowait.generate_imagefolder(root / "train", files=24, classes=3, seed=5)
    zerowait.pack(root / "train", root / "shards", imagefolder=True, sync=False)
    return root


def run_recipe(code: str, data: Path) -> dict:
    """Runs a doc block with its example paths and worker counts replaced; returns its names."""
    for example, path in (("/data/train", data / "train"), ('"shards/"', f'"{data / "shards"}"')):
        code = code.replace(example, str(path))
    code = re.sub(r"(num_workers|map_workers)=\d+", r"\1=2", code)
    namespace: dict = {"__name__": "recipe"}
    exec(compile("import torch, zerowait\nfrom PIL import Image\n" + code, "recipe", "exec"),
         namespace)
    return namespace


def test_the_torchvision_v2_recipe_runs_both_ways(data):
    dataloader_way, zerowait_way = section_blocks(
        "loader-migration.md", "## Recipe: torchvision v2 augmentations through `map`")
    # The DataLoader block uses the imports of the page's first example.
    before = run_recipe("from torchvision import datasets\nfrom torchvision.transforms import v2\n"
                        + dataloader_way, data)
    images, labels = next(iter(before["loader"]))
    assert images.dtype == torch.uint8 and tuple(images.shape) == (24, 3, 224, 224)
    assert set(labels.tolist()) <= {0, 1, 2}

    after = run_recipe(zerowait_way, data)
    with after["loader"] as loader:
        batch = next(iter(loader))
    assert batch["image"].dtype == torch.uint8 and tuple(batch["image"].shape) == (24, 3, 224, 224)
    assert batch["label"].shape == (24,) and set(batch["label"].tolist()) <= {0, 1, 2}


def test_the_per_sample_python_recipe_runs(data):
    block = section_blocks("loader.md", "## Per-sample Python")[0]
    recipe = run_recipe(block, data)
    with recipe["loader"] as loader:
        batch = next(iter(loader))
    assert batch["image"].dtype == torch.uint8 and tuple(batch["image"].shape) == (24, 3, 224, 224)
    assert batch["label"].dtype == torch.int64 and set(batch["label"].tolist()) <= {0, 1, 2}
