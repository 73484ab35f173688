"""Per-sample Python through Loader(map=fn): what fn sees and what the batch holds, random
augmentations that repeat after a resume and whatever the workers, fn errors that follow
on_corrupt, and map workers killed with SIGKILL mid-epoch."""

from __future__ import annotations

import gc
import glob
import os
import random
import signal
import time
import warnings

import numpy as np
import pytest
import torch

import zerowait
from helpers import batches_and_errors

SAMPLES = 60


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """60 samples: a raw field of 1-200 random bytes, a label and a caption; small shards."""
    rng = np.random.default_rng(5)
    rows = [{"__key__": f"s{i:03d}", "blob": rng.integers(0, 256, rng.integers(1, 200),
                                                          dtype=np.uint8).tobytes(),
             "cls": i % 7, "txt": f"caption {i}"} for i in range(SAMPLES)]
    out = tmp_path_factory.mktemp("map") / "ds"
    zerowait.write_dataset(rows, out, shard_size=2 << 10)
    return out, rows


def augment(sample):
    """A random augmentation that draws from all three seeded generators."""
    blob = torch.from_numpy(np.array(sample["blob"], dtype=np.float32))
    return {"mean": blob.mean() + torch.rand(()), "np": float(np.random.rand()),
            "py": random.random(), "cls": sample["cls"], "seed": sample["__seed__"]}


def epoch_rows(loader, limit=None):
    """{index: row of every column} for the rest of the epoch (or `limit` batches)."""
    rows = {}
    for b, batch in enumerate(loader):
        for i, index in enumerate(batch["__index__"].tolist()):
            assert index not in rows, f"sample {index} came twice"
            rows[index] = {k: (v[i].tolist() if isinstance(v, torch.Tensor) else v[i])
                           for k, v in batch.items()}
        if limit is not None and b + 1 == limit:
            break
    return rows


def loader(path, **options):
    options.setdefault("decode", {"cls": "int"})
    return zerowait.Loader(path, 8, seed=3, **options)


def test_fn_sees_views_of_its_sample_and_results_are_collated(dataset):
    path, rows = dataset
    by_key = {r["__key__"]: r for r in rows}

    def fn(sample):
        assert isinstance(sample["blob"], np.ndarray) and sample["blob"].dtype == np.uint8
        return {"blob": torch.from_numpy(sample["blob"].copy()),   # ragged: a list
                "head": torch.full((4,), int(sample["blob"][0])),  # equal shapes: stacked
                "cls": sample["cls"], "key": sample["__key__"], "half": sample["cls"] / 2,
                "txt": bytes(sample["txt"]).decode()}

    with loader(path, keys=True, map=fn, map_workers=2) as zl:
        batch = zl.next()
        assert batch["head"].shape == (8, 4) and batch["head"].dtype == torch.int64
        assert batch["cls"].dtype == torch.int64 and batch["half"].dtype == torch.float64
        assert isinstance(batch["blob"], list) and isinstance(batch["key"], list)
        for i, key in enumerate(batch["__key__"]):
            row = by_key[key]
            assert batch["key"][i] == key
            assert bytes(batch["blob"][i].numpy()) == row["blob"]
            assert batch["cls"][i] == row["cls"] and batch["txt"][i] == row["txt"]
        rest = epoch_rows(zl)
    assert len(rest) + 8 == SAMPLES


def test_dtypes_only_torch_has_and_numpy_output(dataset):
    path, _ = dataset

    def fn(sample):
        value = torch.full((2, 3), float(sample["cls"]), dtype=torch.bfloat16)
        return {"bf16": value, "ragged": value[: 1 + sample["cls"] % 2], "f32": value.float()}

    with loader(path, map=fn, map_workers=1, output="numpy") as zl:
        batch = zl.next()
    assert batch["bf16"].dtype == torch.bfloat16 and batch["bf16"].shape == (8, 2, 3)
    assert isinstance(batch["f32"], np.ndarray) and batch["f32"].shape == (8, 2, 3)
    assert torch.equal(batch["bf16"].float(), torch.from_numpy(batch["f32"]))
    assert [r.dtype for r in batch["ragged"]] == [torch.bfloat16] * 8
    assert {tuple(r.shape) for r in batch["ragged"]} <= {(1, 3), (2, 3)}


def test_numpy_output_and_a_fn_that_keeps_nothing(dataset):
    path, _ = dataset
    with loader(path, map=lambda s: {}, map_workers=1, output="numpy") as zl:
        batch = zl.next()
        assert list(batch) == ["__index__"] and isinstance(batch["__index__"], np.ndarray)


def augment_own_generator(sample):
    """The thread-safe way: a generator of the call's own, seeded from __seed__."""
    rng = np.random.default_rng(sample["__seed__"])
    return {"draw": rng.random(), "cls": sample["cls"], "seed": sample["__seed__"]}


@pytest.mark.parametrize("mode, workers", [("process", 0), ("process", 1), ("thread", 2)])
def test_augmentations_match_two_process_workers_whatever_the_mode(dataset, mode, workers):
    path, _ = dataset
    fn = augment_own_generator if mode == "thread" else augment
    with loader(path, map=fn, map_workers=2) as zl:
        reference = epoch_rows(zl)
    with loader(path, map=fn, map_workers=workers, map_mode=mode) as zl:
        assert epoch_rows(zl) == reference
    assert len(reference) == SAMPLES
    assert len({r["seed"] for r in reference.values()}) == SAMPLES


def test_augmentations_repeat_after_an_exact_resume_with_batches_in_flight(dataset):
    path, _ = dataset
    with loader(path, map=augment, map_workers=2) as zl:
        zl.set_epoch(1)
        whole = epoch_rows(zl)
    with loader(path, map=augment, map_workers=2, map_prefetch=3) as zl:
        zl.set_epoch(1)
        first = epoch_rows(zl, limit=2)
        assert zl.stats()["map"]["batches"] >= 2
        state = zl.state_dict()
    with loader(path, map=augment, map_workers=1) as zl:
        zl.load_state_dict(state)
        rest = epoch_rows(zl)
    assert {**first, **rest} == whole and len(first) + len(rest) == SAMPLES
    # and the next epoch draws other augmentations
    with loader(path, map=augment, map_workers=2, epoch=2) as zl:
        other = epoch_rows(zl)
    assert other.keys() == whole.keys()
    assert all(other[i]["py"] != whole[i]["py"] for i in whole)


def test_set_epoch_mid_epoch_drops_the_batches_in_flight(dataset):
    path, _ = dataset
    with loader(path, map=augment, map_workers=2) as zl:
        zl.next()
        zl.next()
        zl.set_epoch(4)
        assert len(epoch_rows(zl)) == SAMPLES
        assert zl.epoch == 5
    with loader(path, map=augment, epoch=4) as zl:
        assert len(epoch_rows(zl)) == SAMPLES


def fails_on_cls_3(sample):
    if sample["cls"] == 3:
        raise KeyError("no augmentation for class 3")
    return {"cls": sample["cls"]}


def test_an_exception_in_fn_is_skipped_or_raised_naming_the_sample(dataset):
    path, rows = dataset
    failing = {i for i, r in enumerate(rows) if r["cls"] == 3}
    with loader(path, map=fails_on_cls_3, on_corrupt="skip") as zl:
        got = epoch_rows(zl)
        assert set(got) == set(range(SAMPLES)) - failing
        assert zl.stats()["map"]["errors"] == len(failing)
    with loader(path, map=fails_on_cls_3, map_workers=1, keys=True) as zl:
        batches, raised = batches_and_errors(zl, zerowait.MapError)
    got = [i for b in batches for i in b["__index__"].tolist()]
    assert sorted(got) == sorted(set(range(SAMPLES)) - failing)
    assert sorted(e.index for e in raised) == sorted(failing)
    e = raised[0]
    assert e.key == rows[e.index]["__key__"] and e.shard.endswith(".zws")
    assert f"sample {e.index}" in str(e) and "KeyError" in str(e) and "class 3" in str(e)


def test_results_that_cannot_be_collated_raise(dataset):
    path, _ = dataset
    with loader(path, map=lambda s: {"a": 1} if s["cls"] else {"b": 2}, map_workers=1) as zl:
        with pytest.raises(zerowait.MapError, match="same keys"):
            zl.next()
    with loader(path, map=lambda s: [s["cls"]], map_workers=0, on_corrupt="raise") as zl:
        with pytest.raises(zerowait.MapError, match="must return a dict"):
            zl.next()


def kill_self_once(sample, marker_dir):
    """SIGKILLs the worker running sample 17, the first time only (a marker file remembers)."""
    if sample["__index__"] == 17:
        try:
            os.close(os.open(os.path.join(marker_dir, "killed"), os.O_CREAT | os.O_EXCL))
            os.kill(os.getpid(), signal.SIGKILL)
        except FileExistsError:
            pass
    return augment(sample)


def test_a_worker_killed_mid_epoch_is_reported_and_every_sample_comes_once(dataset, tmp_path):
    path, rows = dataset
    with loader(path, map=augment) as zl:
        reference = epoch_rows(zl)
    fn = _bind(kill_self_once, str(tmp_path))
    with loader(path, map=fn, map_workers=2) as zl:
        with pytest.warns(RuntimeWarning, match=r"killed by SIGKILL.*sample 17.*key 's017'"):
            got = epoch_rows(zl)
        stats = zl.stats()["map"]
    assert got == reference
    assert stats["worker_deaths"] == 1 and stats["deaths"][0]["index"] == 17
    assert stats["deaths"][0]["key"] == "s017"


def test_a_worker_killed_from_outside_between_batches(dataset):
    path, _ = dataset
    with loader(path, map=augment) as zl:
        reference = epoch_rows(zl)
    with loader(path, map=augment, map_workers=2, map_prefetch=3) as zl:
        got = epoch_rows(zl, limit=1)
        pid = zl.stats()["map"]["worker_pids"][0]
        os.kill(pid, signal.SIGKILL)
        while not _zombie_or_gone(pid):  # dead before the next call, whatever it held
            time.sleep(0.001)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got.update(epoch_rows(zl))
        stats = zl.stats()["map"]
    assert got == reference
    assert stats["worker_deaths"] == 1
    assert any("killed by SIGKILL" in str(w.message) for w in caught)
    assert all(pid > 0 for pid in stats["worker_pids"]) and len(stats["worker_pids"]) == 2


def kill_self_always(sample):
    if sample["__index__"] == 17:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"cls": sample["cls"]}


def test_a_sample_that_kills_every_worker_is_skipped_or_raised(dataset):
    path, _ = dataset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with loader(path, map=kill_self_always, on_corrupt="skip") as zl:
            got = epoch_rows(zl)
            assert zl.stats()["map"]["worker_deaths"] == 2
        assert set(got) == set(range(SAMPLES)) - {17}
        with loader(path, map=kill_self_always) as zl:
            with pytest.raises(zerowait.MapError, match="sample 17.*died 2 times"):
                epoch_rows(zl)


def test_worker_death_can_raise_and_leave_the_loader_before_the_batch(dataset, tmp_path):
    path, _ = dataset
    with loader(path, map=augment) as zl:
        reference = epoch_rows(zl)
    fn = _bind(kill_self_once, str(tmp_path))
    with loader(path, map=fn, map_on_worker_death="raise") as zl:
        got = {}
        with pytest.raises(zerowait.MapWorkerError, match="sample 17") as raised:
            while True:
                got.update(epoch_rows(zl, limit=1))
        assert raised.value.index == 17
        got.update(epoch_rows(zl))  # the batch with sample 17 runs again, once
    assert got == reference


def started_loader(path):
    """(a loader whose map workers run, their pids, the map folder in /dev/shm it made). Only
    its own folder, as its stats name it, is compared afterwards: tests on the other pytest
    workers make and remove theirs meanwhile (a folder that appeared while this loader started
    may be another test's, still there after this one's close)."""
    zl = loader(path, map=augment, map_workers=2)
    zl.next()
    stats = zl.stats()["map"]
    ours = {stats["shared_dir"]}
    assert ours <= set(glob.glob("/dev/shm/zerowait-map-*")), (
        f"the loader's map folder {stats['shared_dir']} is not in /dev/shm")
    return zl, stats["worker_pids"], ours


def test_close_stops_the_workers_and_removes_the_shared_memory(dataset):
    path, _ = dataset
    zl, pids, ours = started_loader(path)
    zl.close()
    assert not ours & set(glob.glob("/dev/shm/zerowait-map-*"))
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _zombie_or_gone(pid)
    with pytest.raises(zerowait.CancelledError):
        zl.next()


def test_bad_map_options_are_refused(dataset):
    path, _ = dataset
    with pytest.raises(ValueError, match="map_mode"):
        loader(path, map=augment, map_mode="fiber")
    with pytest.raises(ValueError, match="map_on_worker_death"):
        loader(path, map=augment, map_on_worker_death="ignore")
    with pytest.raises(TypeError, match="callable"):
        loader(path, map=42)


def test_stats_say_how_long_batches_waited_on_fn(dataset):
    path, _ = dataset
    with loader(path, map=augment) as zl:
        epoch_rows(zl)
        all_stats = zl.stats()
        stats = all_stats["map"]
        # The cheap counter the StepProfiler reads each step: the two waits, disjoint, summed.
        assert zl.wait_s == all_stats["wait_s"] + stats["wait_s"]
    assert stats["samples"] == SAMPLES and stats["batches"] == -(-SAMPLES // 8)
    assert stats["wait_s"] > 0 and stats["fn_s"] > 0
    assert all(rss >= unique > 0 for rss, unique in
               zip(stats["worker_rss_bytes"], stats["worker_unique_bytes"]))


class _bind:  # noqa: N801 - a picklable functools.partial with the sample first
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __call__(self, sample):
        return self.fn(sample, *self.args)


def _zombie_or_gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_loader_dropped_without_close_frees_its_workers_and_memory(dataset):
    path, _ = dataset
    zl, pids, ours = started_loader(path)
    del zl
    gc.collect()
    assert not ours & set(glob.glob("/dev/shm/zerowait-map-*"))
    assert all(_zombie_or_gone(pid) for pid in pids)


def test_spawned_workers_give_the_same_batches(dataset):
    path, _ = dataset
    with loader(path, map=augment) as zl:
        reference = epoch_rows(zl)
    with loader(path, map=augment, map_workers=1, map_start_method="spawn") as zl:
        assert epoch_rows(zl) == reference
