"""Batches a training loop can keep: small columns are Python's own memory, large ones stay views
of the arena (and the "every arena is held" error names them), and on_corrupt="raise" loses only
the bad sample, with real files: shards of real JPEGs, and a WebDataset tar with truncated ones."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import textwrap

import pytest

import zerowait


def test_keeping_labels_and_indices_holds_no_arena_and_peak_rss_stays_bounded(tmp_path):
    """The PyTorch habit `labels.append(batch["cls"])`, and keeping `__index__`, over an epoch of
    more than 4x the memory budget: it finishes, and the process's peak RSS grows by at most the
    budget + 40 MiB + the kept columns. Measured in a child process, from VmHWM."""
    tree = tmp_path / "tree"
    zerowait.generate_imagefolder(tree, files=1500, classes=5, seed=1,
                                  min_bytes=60_000, max_bytes=100_000)
    out = tmp_path / "shards"
    zerowait.pack(tree, out, imagefolder=True, sync=False)
    budget = 24 << 20
    script = textwrap.dedent(f"""
        import json, zerowait, torch
        def hwm():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"): return int(line.split()[1]) * 1024
        base = hwm()
        loader = zerowait.Loader({str(out)!r}, batch_size=32, memory_budget={budget}, io="pread",
                                 decode={{"cls": "int"}})
        labels, seen, epoch_bytes = [], [], 0
        for batch in loader:
            labels.append(batch["cls"])
            seen.append(batch["__index__"])
            epoch_bytes += batch["jpg"].numel()
        kept = sum(t.numel() * t.element_size() for t in labels + seen)
        print(json.dumps({{"budget": {budget}, "base": base, "peak": hwm(),
                           "epoch_bytes": epoch_bytes, "kept_bytes": kept,
                           "batches": len(labels), "samples": sum(len(t) for t in seen),
                           "labels": torch.cat(labels).tolist(),
                           "indices": torch.cat(seen).tolist(),
                           "arena_bytes": loader.stats()["arena_bytes"]}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    m = json.loads(result.stdout)
    growth = m["peak"] - m["base"]
    print(f"\nbudget {m['budget'] / 2**20:.1f} MiB, epoch {m['epoch_bytes'] / 2**20:.1f} MiB in "
          f"{m['batches']} batches, peak RSS growth {growth / 2**20:.1f} MiB, kept "
          f"{m['kept_bytes']} bytes; bound {(budget + (40 << 20) + m['kept_bytes']) / 2**20:.1f} "
          f"MiB")
    assert m["epoch_bytes"] > 4 * budget
    assert m["samples"] == 1500 and sorted(m["indices"]) == list(range(1500))
    ds = zerowait.Dataset(out)
    assert m["labels"] == [int(ds[i]["cls"]) for i in m["indices"]]  # kept values stay right
    assert m["arena_bytes"] <= budget
    assert growth <= budget + (40 << 20) + m["kept_bytes"], m


def test_small_columns_are_owned_and_large_ones_view_the_arena(image_dataset):
    """Kept small columns leave every arena in the pool; a kept image column holds its arena."""
    loader = zerowait.Loader(image_dataset, batch_size=4, seed=1, threads=1, prefetch=1,
                             decode={"cls": "int", "jpg": zerowait.RandomResizedCrop(128)},
                             keys=True)
    arenas = loader.stats()["arenas"]
    kept = [{name: batch[name] for name in ("cls", "__index__", "__key__")}
            for _ in range(3) for batch in loader]  # 36 batches, far more than the arenas
    assert len(kept) == 36 > arenas
    ds = zerowait.Dataset(image_dataset)
    for k in kept:
        assert [ds.key(i) for i in k["__index__"].tolist()] == k["__key__"]
        assert k["cls"].tolist() == [int(ds[i]["cls"]) for i in k["__index__"].tolist()]
    image = loader.next()["jpg"]  # 4 x 128 x 128 x 3 bytes: over the threshold, zero-copy
    assert image.numel() >= 64 << 10
    loader.close()  # returns every arena not held by the caller
    assert loader.stats()["arenas_free"] == arenas - 1
    del image
    assert loader.stats()["arenas_free"] == arenas


def test_holding_every_arena_names_the_columns_held(image_dataset):
    held = []
    # Closed on the way out: the error's traceback holds the frame, and so the loader.
    with zerowait.Loader(image_dataset, batch_size=4, seed=1, threads=1, prefetch=1,
                         decode={"cls": "int", "jpg": zerowait.RandomResizedCrop(128)}) as loader:
        with pytest.raises(zerowait.ResourceExhaustedError) as error:
            for _ in range(loader.stats()["arenas"] + 1):
                batch = loader.next()
                held.append((batch["jpg"][0], batch["cls"]))  # a view of one image, and labels
    message = str(error.value)
    assert "batch 0 of epoch 0 (columns 'jpg')" in message, message
    assert "'cls'" not in message and ".clone()" in message


def write_tar_with_truncated_jpegs(image_tree, path, truncated: set[int]) -> list[str]:
    """A WebDataset tar of the tree's JPEGs ("jpg", "cls"), the samples in `truncated` cut to
    a third of their bytes. Returns the keys in tar order."""
    files = sorted(p for p in image_tree.rglob("*.jpg"))
    classes = sorted({p.parent.name for p in files})
    keys = []
    with tarfile.open(path, "w") as tar:
        for i, p in enumerate(files):
            key = f"s{i:04d}"
            jpeg = p.read_bytes()
            if i in truncated:
                jpeg = jpeg[:len(jpeg) // 3]
            for ext, data in (("jpg", jpeg), ("cls", str(classes.index(p.parent.name)).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            keys.append(key)
    return keys


def test_a_truncated_jpeg_raises_once_and_costs_only_itself(image_tree, tmp_path):
    """on_corrupt="raise": each truncated JPEG raises CorruptDataError naming its key; the next
    next() goes on where it stopped, and the batch that held it comes without it."""
    truncated = {9, 10, 30}  # two in the same batch of 8
    path = tmp_path / "part-000.tar"
    keys = write_tar_with_truncated_jpegs(image_tree, path, truncated)
    loader = zerowait.Loader(path, batch_size=8, shuffle=False, keys=True,
                             decode={"jpg": zerowait.CenterCrop(32), "cls": "int"})
    delivered, errors = [], []
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        except zerowait.CorruptDataError as e:
            errors.append(str(e))
            continue
        assert tuple(batch["jpg"].shape) == (len(batch["__key__"]), 32, 32, 3)
        delivered.append(batch["__key__"])
    bad = [keys[i] for i in sorted(truncated)]
    assert len(errors) == 3
    for key, message in zip(bad, errors):
        assert f"'{key}'" in message and "jpg" in message, message
    assert sum(delivered, []) == [k for k in keys if k not in bad]  # every good one, in order
    assert [len(b) for b in delivered[:2]] == [8, 6]  # batch 1 lost only its two bad samples
    assert loader.stats()["skipped"] == 3
    assert loader.epoch == 1
