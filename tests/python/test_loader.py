"""zerowait.Loader from Python: torch tensors viewing native arenas, determinism, exact resume,
corrupt samples, bounded memory, clean shutdown, and real ranks through torch.distributed."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import zerowait
from helpers import flip_byte, free_port

HERE = Path(__file__).parent


def epoch(loader) -> list[list[int]]:
    return [b["__index__"].tolist() for b in loader]


def test_batches_are_torch_tensors_viewing_the_arena(image_dataset):
    loader = zerowait.Loader(image_dataset, batch_size=8, seed=1,
                             decode={"cls": "int", "jpg": zerowait.RandomResizedCrop(32, flip=True)},
                             keys=True)
    batch = next(iter(loader))
    assert batch["jpg"].dtype == torch.uint8 and tuple(batch["jpg"].shape) == (8, 32, 32, 3)
    assert batch["cls"].dtype == torch.int64 and batch["__index__"].dtype == torch.int64
    assert len(batch["__key__"]) == 8
    ds = zerowait.Dataset(image_dataset)
    for i, key in zip(batch["__index__"].tolist(), batch["__key__"]):
        assert ds.key(i) == key
        assert int(ds[i]["cls"]) == batch["cls"][batch["__key__"].index(key)].item()


def test_a_view_of_a_batch_keeps_its_arena_until_freed(image_dataset):
    """Large columns point into the arena (no copy): even a view of one image keeps its batch's
    arena out of the pool, and freeing the views gives the arenas back."""
    loader = zerowait.Loader(image_dataset, batch_size=4, seed=1, threads=1, prefetch=1,
                             decode={"jpg": zerowait.RandomResizedCrop(128)})
    arenas = loader.stats()["arenas"]
    views = []
    with pytest.raises(zerowait.ResourceExhaustedError, match="held by the caller"):
        for _ in range(arenas + 1):
            views.append(loader.next()["jpg"][0])
    assert len(views) == arenas
    pointers = {v.data_ptr() for v in views}
    assert len(pointers) == arenas  # one arena each
    del views
    gc.collect()
    batch = loader.next()  # the batch that could not be built before
    assert tuple(batch["jpg"].shape) == (4, 128, 128, 3)


def test_raw_fields_are_flat_bytes_with_offsets(image_dataset):
    ds = zerowait.Dataset(image_dataset)
    loader = zerowait.Loader(image_dataset, batch_size=16, shuffle=False, output="numpy")
    batch = loader.next()
    offsets = batch["jpg.offsets"]
    assert isinstance(batch["jpg"], np.ndarray) and offsets[0] == 0
    for row, i in enumerate(batch["__index__"]):
        assert batch["jpg"][offsets[row]:offsets[row + 1]].tobytes() == ds[int(i)]["jpg"]


def test_order_is_a_function_of_seed_and_epoch(image_dataset):
    a = zerowait.Loader(image_dataset, batch_size=5, seed=4, threads=1)
    b = zerowait.Loader(image_dataset, batch_size=5, seed=4, threads=3, prefetch=8)
    first = epoch(a)
    assert first == epoch(b)
    assert sorted(sum(first, [])) == list(range(48))
    assert epoch(a) != first  # the next epoch
    c = zerowait.Loader(image_dataset, batch_size=5, seed=5)
    assert epoch(c) != first


def test_state_dict_resumes_exactly_also_with_another_world_size(image_dataset, tmp_path):
    full = epoch(zerowait.Loader(image_dataset, batch_size=4, seed=2, epoch=1))
    loader = zerowait.Loader(image_dataset, batch_size=4, seed=2, epoch=1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))  # survives a JSON round trip
    del it, loader
    resumed = zerowait.Loader(image_dataset, batch_size=4, seed=2)
    resumed.load_state_dict(state)
    assert epoch(resumed) == full[3:]

    # Two ranks take 2 batches each, then three ranks finish the epoch.
    seen = []
    for rank in range(2):
        ranked = zerowait.Loader(image_dataset, batch_size=4, seed=2, rank=rank, world_size=2)
        it = iter(ranked)
        seen += next(it)["__index__"].tolist() + next(it)["__index__"].tolist()
        state = ranked.state_dict()
    for rank in range(3):
        ranked = zerowait.Loader(image_dataset, batch_size=3, seed=2, rank=rank, world_size=3)
        ranked.load_state_dict(state)
        seen += sum(epoch(ranked), [])
    assert sorted(seen) == list(range(48))


def test_next_takes_a_timeout(image_dataset):
    """The wiring of next(timeout=): a batch that is ready in time is returned as without one
    (the C++ tests stall reads to show the timeout firing and nothing lost)."""
    plain = zerowait.Loader(image_dataset, batch_size=4, seed=3, output="numpy")
    timed = zerowait.Loader(image_dataset, batch_size=4, seed=3, output="numpy")
    assert (timed.next(timeout=60.0)["__index__"] == plain.next()["__index__"]).all()


def test_load_state_dict_refuses_another_seed(image_dataset):
    state = zerowait.Loader(image_dataset, seed=1).state_dict()
    with pytest.raises(zerowait.InvalidArgumentError, match="seed"):
        zerowait.Loader(image_dataset, seed=2).load_state_dict(state)


def test_a_state_saved_before_the_random_order_changed_is_refused_unless_unaffected(
        image_dataset):
    """Version 1 states were saved when "random" was another permutation: resuming one would
    repeat and skip samples, so it is refused with the way out; "quasi" and "none" orders did not
    change, and their version 1 states still resume."""
    state = zerowait.Loader(image_dataset, batch_size=4, seed=1).state_dict()
    assert state["version"] == 2
    old = dict(state, version=1)
    with pytest.raises(zerowait.InvalidArgumentError, match="version 1.*'random' order differs"):
        zerowait.Loader(image_dataset, batch_size=4, seed=1).load_state_dict(old)
    quasi = zerowait.Loader(image_dataset, batch_size=4, seed=1, shuffle="quasi")
    next(iter(quasi))
    old_quasi = dict(quasi.state_dict(), version=1)
    resumed = zerowait.Loader(image_dataset, batch_size=4, seed=1, shuffle="quasi")
    resumed.load_state_dict(old_quasi)
    assert resumed.state_dict()["position"] == 4


def corrupt_first_sample(dataset: Path) -> str:
    """Flips a byte inside the first sample of the first shard; returns that sample's key."""
    ds = zerowait.Dataset(dataset)
    flip_byte(ds.shards[0]["path"], 4096 + 10)  # the data region starts at 4 KiB
    return ds.key(0)


def test_corrupt_sample_raises_or_is_skipped(image_tree, tmp_path):
    out = tmp_path / "shards"
    zerowait.pack(image_tree, out, imagefolder=True, sync=False)
    key = corrupt_first_sample(out)
    with pytest.raises(zerowait.CorruptDataError, match=key):
        epoch(zerowait.Loader(out, batch_size=48, shuffle=False))
    loader = zerowait.Loader(out, batch_size=48, shuffle=False, on_corrupt="skip")
    batches = epoch(loader)
    assert sorted(sum(batches, [])) == list(range(1, 48))
    assert loader.stats()["skipped"] == 1


def test_stopping_mid_epoch_neither_hangs_nor_leaks(image_dataset):
    script = textwrap.dedent(f"""
        import zerowait
        loader = zerowait.Loader({str(image_dataset)!r}, batch_size=2, prefetch=8, threads=4)
        held = [next(iter(loader))]
        del loader          # workers stop with batches in flight and one held here
        assert held[0]["__index__"].numel() == 2
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_rank_and_world_size_default_to_the_environment(image_dataset, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = zerowait.Loader(image_dataset, batch_size=4)
    assert (loader.rank, loader.world_size) == (1, 3)
    assert len(loader) == 4  # 48 samples / (4 x 3)


def test_bad_options_are_clear_errors(image_dataset):
    with pytest.raises(zerowait.InvalidArgumentError, match="rank 2"):
        zerowait.Loader(image_dataset, rank=2, world_size=2)
    with pytest.raises(zerowait.InvalidArgumentError, match="shuffle"):
        zerowait.Loader(image_dataset, shuffle="sorted")
    with pytest.raises(zerowait.InvalidArgumentError, match="nope"):
        zerowait.Loader(image_dataset, fields=["jpg"], decode={"nope": "int"})
    with pytest.raises(zerowait.ResourceExhaustedError, match="memory_budget"):
        zerowait.Loader(image_dataset, batch_size=48, memory_budget=1 << 10)


def test_the_memory_budget_is_sized_unless_set(image_dataset):
    sized = zerowait.Loader(image_dataset, batch_size=48, threads=1, prefetch=2)
    assert sized.stats()["memory_budget"] >= 512 << 20  # small batches: the floor
    assert sized.stats()["arenas"] == 1 + 2 + 2
    fixed = zerowait.Loader(image_dataset, batch_size=48, memory_budget=64 << 20)
    assert fixed.stats()["memory_budget"] == 64 << 20


def test_two_processes_as_ranks_through_torch_distributed(image_dataset, tmp_path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "dist_loader_worker.py"), str(image_dataset),
                          str(tmp_path)], env=dict(env, RANK=str(rank)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    results = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 for r in results)
    assert results[0]["batches"] == results[1]["batches"] == results[0]["max_steps"]
    a, b = (set(r["indices"]) for r in results)
    assert not a & b and a | b == set(range(48))


def test_webdataset_tar_is_loaded_in_place(tmp_path):
    import io
    import tarfile

    path = tmp_path / "part-000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(30):
            for ext, data in (("txt", f"sample {i}".encode() * (i + 1)), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    loader = zerowait.Loader(path, batch_size=7, seed=1, decode={"cls": "int"}, keys=True,
                             output="numpy")
    seen = {}
    for batch in loader:
        offsets = batch["txt.offsets"]
        for row, key in enumerate(batch["__key__"]):
            seen[key] = (batch["txt"][offsets[row]:offsets[row + 1]].tobytes(),
                         int(batch["cls"][row]))
    assert len(seen) == 30
    for i in range(30):
        assert seen[f"s{i:04d}"] == (f"sample {i}".encode() * (i + 1), i % 3)


def test_autotune_changes_speed_not_batches(image_dataset):
    plain = epoch(zerowait.Loader(image_dataset, batch_size=3, seed=6))
    tuned = zerowait.Loader(image_dataset, batch_size=3, seed=6, autotune=True, threads=2,
                            prefetch=8)
    for _ in range(3):  # 16 batches an epoch; the controller looks every 32
        epoch(tuned)
    tuned.set_epoch(0)
    assert epoch(tuned) == plain
    # That the controller does raise prefetch while the consumer waits is shown in C++, where
    # reads can be slowed at will (AutotuneRaisesPrefetchWhileTheConsumerWaitsAndKeepsTheBatches).


def test_drop_last_drops_the_partial_step_and_keeps_it_otherwise(image_dataset):
    kept = epoch(zerowait.Loader(image_dataset, batch_size=5, seed=3))
    dropped_loader = zerowait.Loader(image_dataset, batch_size=5, seed=3, drop_last=True)
    dropped = epoch(dropped_loader)
    assert [len(b) for b in kept] == [5] * 9 + [3]  # 48 samples
    assert len(dropped_loader) == len(dropped) == 9 and dropped == kept[:9]
    assert sorted(sum(kept, [])) == list(range(48))


def test_quasi_shuffle_draws_each_window_from_its_blocks(image_dataset):
    """shuffle_block / shuffle_window reach the order: each window of `window` blocks holds the
    samples of exactly those blocks (runs of `block` consecutive samples of one shard)."""
    ds = zerowait.Dataset(image_dataset)
    first = 0
    block_of = {}
    for s, shard in enumerate(ds.shards):
        for local in range(shard["samples"]):
            block_of[first + local] = (s, local // 4)
        first += shard["samples"]
    order = sum(epoch(zerowait.Loader(image_dataset, batch_size=48, shuffle="quasi", seed=2,
                                      shuffle_block=4, shuffle_window=2)), [])
    assert sorted(order) == list(range(48))
    sizes = {}
    for i in range(48):
        sizes[block_of[i]] = sizes.get(block_of[i], 0) + 1
    position = 0
    while position < 48:  # walk the windows: each closes over at most two whole blocks
        window = {block_of[order[position]]}
        while True:
            size = sum(sizes[b] for b in window)
            grown = window | {block_of[i] for i in order[position:position + size]}
            if grown == window:
                break
            window = grown
        assert len(window) <= 2, (position, window)
        position += size
    wider = sum(epoch(zerowait.Loader(image_dataset, batch_size=48, shuffle="quasi", seed=2,
                                      shuffle_block=8, shuffle_window=2)), [])
    assert wider != order


def test_block_shuffle_deals_blocks_to_nodes_without_overlap(image_dataset):
    """shuffle="block" with nodes/node: each node's loader gets as many batches as the others,
    no sample twice, and (redeal_every=0) the same share every epoch, shuffled anew."""
    def node_loader(node):
        return zerowait.Loader(image_dataset, batch_size=4, shuffle="block", seed=3,
                               block_bytes=8 << 10, window_bytes=32 << 10, nodes=2, node=node,
                               rank=0, world_size=1)
    shares = []
    for node in (0, 1):
        loader = node_loader(node)
        first, second = sum(epoch(loader), []), sum(epoch(loader), [])
        assert first != second  # shuffled anew
        # The same share (redeal_every=0), up to the few samples the cut leaves out each epoch.
        assert len(set(first) & set(second)) >= len(first) - 8
        shares.append(first)
    assert len(shares[0]) == len(shares[1]) > 0
    assert not set(shares[0]) & set(shares[1])
    assert node_loader(0).state_dict()["nodes"] == 2
    with pytest.raises(zerowait.InvalidArgumentError, match="needs shuffle"):
        zerowait.Loader(image_dataset, shuffle="random", nodes=2, node=0, rank=0, world_size=1)


def test_nodes_take_the_node_and_local_ranks_from_torchrun(image_dataset, monkeypatch):
    """With nodes=N the ranks counted are the node's: under torchrun GROUP_RANK, LOCAL_RANK
    and LOCAL_WORLD_SIZE, not the global RANK / WORLD_SIZE; elsewhere the call must say."""
    options = dict(batch_size=4, shuffle="block", seed=3, block_bytes=8 << 10,
                   window_bytes=32 << 10, nodes=2)
    explicit = sum(epoch(zerowait.Loader(image_dataset, node=1, rank=1, world_size=2,
                                         **options)), [])
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="node=, rank=, world_size="):
        zerowait.Loader(image_dataset, **options)
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert sum(epoch(zerowait.Loader(image_dataset, **options)), []) == explicit
    state = zerowait.Loader(image_dataset, **options).state_dict()
    assert (state["nodes"], state["world_size"]) == (2, 2)


def test_verify_false_delivers_a_damaged_sample_that_verify_true_refuses(image_tree, tmp_path):
    out = tmp_path / "shards"
    zerowait.pack(image_tree, out, imagefolder=True, sync=False)
    original = zerowait.Dataset(out)[0]["jpg"]
    key = corrupt_first_sample(out)
    with pytest.raises(zerowait.CorruptDataError, match=key):
        zerowait.Loader(out, batch_size=4, shuffle=False, output="numpy").next()
    batch = zerowait.Loader(out, batch_size=4, shuffle=False, verify=False, output="numpy").next()
    offsets = batch["jpg.offsets"]
    delivered = batch["jpg"][offsets[0]:offsets[1]].tobytes()
    assert len(delivered) == len(original) and delivered != original  # unchecked, as asked


def test_device_cuda_without_cuda_is_a_clear_error(image_dataset):
    """setup installs a CPU torch, so this always runs here (test_gpu_loader.py: with CUDA)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: test_gpu_loader.py covers device='cuda'")
    with pytest.raises(ValueError, match="torch.cuda is not available"):
        zerowait.Loader(image_dataset, batch_size=4, device="cuda")
    with pytest.raises(ValueError, match="output='torch'"):
        zerowait.Loader(image_dataset, batch_size=4, device="cuda", output="numpy")
    with pytest.raises(ValueError, match="out= holds device buffers: it needs device='cuda'"):
        zerowait.Loader(image_dataset, batch_size=4, out={"jpg": torch.empty(4)})
