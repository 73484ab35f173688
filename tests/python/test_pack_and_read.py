"""Packing real trees of files and reading them back through zerowait.Dataset."""

from __future__ import annotations

import pickle
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import zerowait
from helpers import dataset_contents, read_tree


def test_round_trip_is_byte_identical(random_tree, tmp_path):
    root, expected = random_tree
    out = tmp_path / "shards"
    report = zerowait.pack(root, out, shard_size=32 * 1024, sync=False)

    assert report["samples"] == len(expected)
    assert report["files"] == sum(len(fields) for fields in expected.values())
    assert report["bytes_in"] == sum(len(b) for f in expected.values() for b in f.values())
    assert report["quarantined"] == []
    assert report["shards"] > 1, "a 32 KiB shard size must split 40 samples into several shards"
    assert Path(report["manifest_path"]) == out / "manifest.json"

    ds = zerowait.Dataset(out)
    assert len(ds) == len(expected)
    assert dataset_contents(ds) == expected
    assert ds.fields == ["bin", "meta.json", "zeros"]
    assert ds.classes == []


def test_sample_is_a_dict_of_its_fields_only(random_tree, tmp_path):
    root, expected = random_tree
    zerowait.pack(root, tmp_path / "shards", sync=False)
    ds = zerowait.Dataset(tmp_path / "shards")
    sample = ds[0]
    assert type(sample) is dict
    assert set(sample) == set(expected[ds.key(0)])
    assert all(type(v) is bytes for v in sample.values())


def test_shards_describe_the_files_on_disk(random_tree, tmp_path):
    root, expected = random_tree
    report = zerowait.pack(root, tmp_path / "shards", shard_size=32 * 1024, sync=False)
    ds = zerowait.Dataset(tmp_path / "shards")
    assert ds.shard_count == report["shards"] == len(ds.shards)
    assert sum(s["samples"] for s in ds.shards) == len(ds)
    for shard in ds.shards:
        assert Path(shard["path"]).stat().st_size == shard["bytes"]
    assert sum(s["bytes"] for s in ds.shards) == report["bytes_out"]


def test_every_way_to_open_a_dataset_reads_the_same_samples(random_tree, tmp_path):
    root, expected = random_tree
    out = tmp_path / "shards"
    zerowait.pack(root, out, shard_size=32 * 1024, sync=False)
    by_manifest = zerowait.Dataset(out / "manifest.json")
    assert dataset_contents(by_manifest) == expected
    assert dataset_contents(zerowait.Dataset(str(out), io="mmap")) == expected
    # One shard on its own holds exactly the samples the manifest assigns to it.
    first = by_manifest.shards[0]
    single = zerowait.Dataset(first["path"])
    assert len(single) == first["samples"]
    assert single[0] == by_manifest[0]


def test_negative_indices_count_from_the_end(random_tree, tmp_path):
    root, _ = random_tree
    zerowait.pack(root, tmp_path / "shards", shard_size=32 * 1024, sync=False)
    ds = zerowait.Dataset(tmp_path / "shards")
    n = len(ds)
    assert ds[-1] == ds[n - 1]
    assert ds[-n] == ds[0]
    assert ds.key(-1) == ds.key(n - 1)


@pytest.mark.parametrize("index", ["len", "-len-1", "huge"])
def test_out_of_range_index_raises_index_error(random_tree, tmp_path, index):
    root, _ = random_tree
    zerowait.pack(root, tmp_path / "shards", sync=False)
    ds = zerowait.Dataset(tmp_path / "shards")
    i = {"len": len(ds), "-len-1": -len(ds) - 1, "huge": 2**62}[index]
    with pytest.raises(IndexError, match="out of range"):
        ds[i]
    with pytest.raises(IndexError):
        ds.key(i)


def test_iteration_and_pickling(random_tree, tmp_path):
    root, expected = random_tree
    zerowait.pack(root, tmp_path / "shards", sync=False)
    ds = zerowait.Dataset(tmp_path / "shards", io="mmap")
    # __len__ + __getitem__ raising IndexError make a Dataset iterable like a list.
    assert len(list(ds)) == len(expected)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.io == "mmap"
    assert len(clone) == len(ds) and clone[5] == ds[5]


def test_imagefolder_fields_and_classes(image_tree, image_dataset):
    ds = zerowait.Dataset(image_dataset)
    class_dirs = sorted(p.name for p in image_tree.iterdir() if p.is_dir())
    assert ds.classes == class_dirs
    assert ds.fields == ["cls", "jpg"]
    assert len(ds) == 48

    # Every source JPEG comes back once, labelled with the index of its directory's name.
    expected = Counter(
        (rel.split("/")[0], data) for rel, data in read_tree(image_tree).items()
    )
    seen = Counter()
    for i in range(len(ds)):
        sample = ds[i]
        assert sample["cls"].isdigit(), "cls is ASCII decimal"
        cls = ds.classes[int(sample["cls"])]
        assert ds.key(i).split("/")[0] == cls
        assert sample["jpg"][:2] == b"\xff\xd8"
        seen[(cls, sample["jpg"])] += 1
    assert seen == expected


def test_truncated_jpeg_is_quarantined_not_packed(image_tree, tmp_path):
    src = tmp_path / "images"
    for rel, data in read_tree(image_tree).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    victim = sorted(src.rglob("*.jpg"))[5]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])

    report = zerowait.pack(src, tmp_path / "shards", imagefolder=True, sync=False)
    assert [Path(q["path"]).resolve() for q in report["quarantined"]] == [victim.resolve()]
    assert report["quarantined"][0]["reason"]
    assert report["samples"] == 47
    ds = zerowait.Dataset(tmp_path / "shards")
    victim_key = victim.relative_to(src).with_suffix("").as_posix()
    assert victim_key not in {ds.key(i) for i in range(len(ds))}
    assert (tmp_path / "shards" / "quarantine.json").exists()


def test_progress_callback_reports_every_file(random_tree, tmp_path):
    root, expected = random_tree
    calls = []
    report = zerowait.pack(root, tmp_path / "shards", sync=False, progress=calls.append)
    assert calls, "progress was never called"
    assert set(calls[0]) == {"files_done", "files_total", "bytes_done", "bytes_total"}
    done = [c["files_done"] for c in calls]
    assert done == sorted(done)
    assert calls[-1]["files_done"] == calls[-1]["files_total"] == report["files"]


def test_exception_in_progress_callback_is_raised(random_tree, tmp_path):
    root, _ = random_tree

    def fail(progress):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        zerowait.pack(root, tmp_path / "shards", sync=False, progress=fail)


def test_packing_twice_gives_identical_bytes(random_tree, image_tree, tmp_path):
    root, _ = random_tree
    for sources, imagefolder in (([root], False), ([image_tree], True)):
        outs = [tmp_path / f"run{n}-{imagefolder}" for n in (1, 2)]
        for out, threads in zip(outs, (1, 3)):
            zerowait.pack(sources, out, imagefolder=imagefolder, shard_size=48 * 1024,
                          threads=threads, sync=False)
        first, second = (read_tree(out) for out in outs)
        assert sorted(first) == sorted(second)
        assert any(name.endswith(".zws") for name in first)
        for name in first:
            assert first[name] == second[name], f"{name} differs between two packs"


def count_while(call, max_calls: int = 1) -> int:
    """Runs call() while another Python thread counts; returns how far it counted meanwhile.

    The switch interval is raised far beyond the test's length, so the interpreter never takes
    the GIL away from a thread: the counting thread can only run when the calling thread gives
    the GIL up of its own accord, and between reading `before` and `after` only call() can do
    that. A call that holds the GIL throughout gives exactly 0, however long it runs, and however
    often it is repeated: a quick call is repeated, up to `max_calls` times, until the counting
    thread has run (waking it takes tens of microseconds, longer on a busy machine).
    """
    counter = 0
    stop = threading.Event()

    def count():
        nonlocal counter
        while not stop.is_set():
            counter += 1
            time.sleep(0)  # hands the GIL back, so the calling thread is never starved

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1000)
    thread = threading.Thread(target=count)
    thread.start()
    try:
        before = counter
        for _ in range(max_calls):
            call()
            if counter != before:
                break
        after = counter
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old_interval)
    return after - before


def test_blocking_calls_release_the_gil(tmp_path):
    """A Python thread makes progress while pack, generate, verify and reads run."""
    src, out = tmp_path / "images", tmp_path / "shards"
    assert count_while(lambda: zerowait.generate_imagefolder(src, files=200, classes=2)) > 0
    assert count_while(lambda: zerowait.pack(src, out, imagefolder=True, sync=True)) > 0
    ds = zerowait.Dataset(out)
    assert count_while(ds.verify, max_calls=1000) > 0
    assert count_while(lambda: [ds[i] for i in range(len(ds))], max_calls=100) > 0


def test_reads_from_threads_agree(random_tree, tmp_path):
    root, expected = random_tree
    zerowait.pack(root, tmp_path / "shards", shard_size=32 * 1024, sync=False)
    ds = zerowait.Dataset(tmp_path / "shards")
    results = [None] * 4

    def read_all(slot):
        results[slot] = dataset_contents(ds)

    threads = [threading.Thread(target=read_all, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == expected for r in results)


def test_verify_of_an_intact_dataset_finds_nothing(image_dataset):
    assert zerowait.Dataset(image_dataset).verify() == []


def test_parts_packed_from_python_merge_into_the_samples_of_one_pack(random_tree, tmp_path):
    root, expected = random_tree
    whole = tmp_path / "whole"
    zerowait.pack(root, whole, shard_size=32 * 1024, sync=False)
    out = tmp_path / "parts"
    # Both spellings of a part, as a launcher's rank and world size would give them.
    for part in [(0, 3), "1/3", (2, 3)]:
        report = zerowait.pack(root, out, shard_size=32 * 1024, sync=False, part=part)
        index = part[0] if isinstance(part, tuple) else 1
        assert Path(report["manifest_path"]) == out / f"part-{index:04d}-of-0003" / "manifest.json"
    merged = zerowait.merge(out, sync=False)
    assert merged["part_count"] == 3
    assert Path(merged["manifest_path"]) == out / "manifest.json"
    assert [p["dir"] for p in merged["parts"]] == [f"part-{i:04d}-of-0003" for i in range(3)]
    assert merged["samples"] == sum(p["samples"] for p in merged["parts"]) == len(expected)
    ds, one = zerowait.Dataset(out), zerowait.Dataset(whole)
    assert [ds.key(i) for i in range(len(ds))] == [one.key(i) for i in range(len(one))]
    assert dataset_contents(ds) == expected

    with pytest.raises(zerowait.AlreadyExistsError, match="--overwrite"):
        zerowait.merge(out)
    assert zerowait.merge(out, [out / "part-0000-of-0003", out / "part-0001-of-0003",
                                out / "part-0002-of-0003"], overwrite=True)["part_count"] == 3
    with pytest.raises(zerowait.ZerowaitNotFoundError, match=r"1 of 3 parts missing \(1\)"):
        zerowait.merge(out, [out / "part-0000-of-0003", out / "part-0002-of-0003"],
                       overwrite=True)
    with pytest.raises(zerowait.InvalidArgumentError, match="3/3"):
        zerowait.pack(root, tmp_path / "bad", part=(3, 3))
    with pytest.raises(TypeError, match="pair"):
        zerowait.pack(root, tmp_path / "bad", part=(0, 1, 2))


def test_version_and_public_names():
    assert zerowait.__version__.count(".") == 2
    for name in zerowait.__all__:
        assert hasattr(zerowait, name), name
