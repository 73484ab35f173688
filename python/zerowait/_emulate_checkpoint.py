"""The checkpointing workloads of ``zerowait emulate`` (llama3-8b, llama3-70b), after MLPerf
Storage's: R rank processes each write their share of the checkpoint with fsync, then read it
back after it has been dropped from the page cache. Besides the throughputs, each rank's state
is also saved the way most training code saves it, torch.save + fsync, to compare the time the
training loop is blocked: zerowait.Checkpointer.save() returns once the state is snapshotted,
torch.save returns once the bytes are written.

Phases, each started by every rank at once (a barrier): torch.save + fsync; K saves through
zerowait.Checkpointer (blocking = save(), write = save() to the commit); K loads of the last
step through Checkpointer.load(); one torch.load. Before each read the files are evicted from
the page cache. Throughput = the checkpoint's bytes / (last rank's end - first rank's start),
averaged over the K checkpoints; blocking = the slowest rank's (the job waits for it).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import time
import traceback
from typing import Dict, List

import numpy as np

from zerowait import _emulate_train
from zerowait._emulate_workloads import METADATA, Checkpointing, evict

BARRIER_TIMEOUT = 900
CHUNK = 64 << 20  # bytes per tensor: layer-sized pieces rather than one buffer


def make_state(nbytes: int, seed: int) -> Dict:
    """A training state of about ``nbytes`` random bytes: bf16 weights (1/7) and fp32 Adam
    state (6/7: master weights and two moments, as in mixed-precision training)."""
    import torch

    rng = np.random.default_rng(seed)

    def tensors(total: int, dtype) -> List:
        out = []
        left = total
        while left > 0:
            size = min(CHUNK, left)
            size -= size % 4
            if size <= 0:
                break
            raw = np.frombuffer(rng.bytes(size), dtype=np.uint8).copy()
            out.append(torch.from_numpy(raw).view(dtype))
            left -= size
        return out

    model = nbytes // 7
    return {"model": tensors(model, torch.bfloat16),
            "optimizer": tensors(nbytes - model, torch.float32)}


def _timed(barrier, fn):
    barrier.wait(BARRIER_TIMEOUT)
    t0 = time.monotonic()
    value = fn()
    return t0, time.monotonic(), value


def _rank_main(rank: int, spec: Dict, barrier, results) -> None:
    import torch

    import zerowait

    try:
        world, count = spec["ranks"], spec["checkpoints"]
        state = make_state(spec["rank_bytes"], spec["seed"] + rank)
        nbytes = sum(t.numel() * t.element_size() for part in state.values() for t in part)
        torch_path = os.path.join(spec["dir"], "torch", f"rank{rank:05d}.pt")
        zerowait_dir = os.path.join(spec["dir"], "zerowait")

        def save_sync():
            with open(torch_path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        out: Dict = dict(rank=rank, bytes=nbytes)
        t0, t1, _ = _timed(barrier, save_sync)
        out["torch_save"] = [t0, t1]
        saves = []
        with zerowait.Checkpointer(zerowait_dir, keep_last=1, rank=rank,
                                   world_size=world) as checkpointer:
            for step in range(count):
                t0, t1, handle = _timed(barrier, lambda s=step: checkpointer.save(s, state))
                handle.wait()
                saves.append([t0, t1, time.monotonic()])
            out["saves"] = saves
            loads = []
            for _ in range(count):
                barrier.wait(BARRIER_TIMEOUT)
                if rank == 0:  # every rank's part is committed: drop all of them
                    evict(_files(zerowait_dir))
                t0, t1, _ = _timed(barrier, lambda: checkpointer.load(step=count - 1))
                loads.append([t0, t1])
            out["loads"] = loads
        barrier.wait(BARRIER_TIMEOUT)
        if rank == 0:
            evict(_files(os.path.dirname(torch_path)))
        t0, t1, _ = _timed(barrier, lambda: torch.load(torch_path, weights_only=True))
        out["torch_load"] = [t0, t1]
        results.put(("ok", rank, out))
    except BaseException as error:
        results.put(("error", rank, f"{type(error).__name__}: {error}\n"
                     f"{traceback.format_exc(limit=4)}"))
        barrier.abort()  # the other ranks stop waiting (BrokenBarrierError)


def _files(root: str) -> List[str]:
    return [os.path.join(p, n) for p, _, names in os.walk(root) for n in names]


def prepare_dir(directory: str, workload: str) -> None:
    """Makes ``directory`` ready for a run: refuses a non-empty directory that an earlier run
    did not make, and empties the parts an earlier run left."""
    marker = os.path.join(directory, METADATA)
    if os.path.isdir(directory) and os.listdir(directory):
        try:
            with open(marker) as f:
                ours = json.load(f).get("kind") == "checkpointing"
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise ValueError(f"{directory} is not empty and holds no checkpoint run of zerowait "
                             f"emulate ({marker}); give an empty or new directory")
    for part in ("zerowait", "torch"):
        shutil.rmtree(os.path.join(directory, part), ignore_errors=True)
        os.makedirs(os.path.join(directory, part))
    with open(marker, "w") as f:
        json.dump({"kind": "checkpointing", "workload": workload}, f)
        f.write("\n")


def run(preset: Checkpointing, spec: Dict, log) -> Dict:
    """spec: dir, ranks, scale, checkpoints, seed. Returns the measured numbers."""
    world = spec["ranks"]
    total = round(preset.total_bytes * spec["scale"])
    spec = dict(spec, rank_bytes=math.ceil(total / world))
    prepare_dir(spec["dir"], preset.name)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(world)
    results = context.Queue()
    ranks = [context.Process(target=_rank_main, args=(r, spec, barrier, results))
             for r in range(world)]
    start = time.monotonic()
    for process in ranks:
        process.start()
    reports = _emulate_train.gather(ranks, results, f"{preset.name} checkpointing, {world} ranks")
    return summarise([reports[r][0] for r in sorted(reports)], time.monotonic() - start)


def _span(pairs: List[List[float]]) -> float:
    return max(p[-1] for p in pairs) - min(p[0] for p in pairs)


def summarise(reports: List[Dict], duration: float) -> Dict:
    total = sum(r["bytes"] for r in reports)
    count = len(reports[0]["saves"])

    def mean_rate(key: str, end: int) -> float:
        return float(np.mean([total / _span([r[key][k][:1] + r[key][k][end:end + 1]
                                             for r in reports]) for k in range(count)]))

    blocking = [max(r["saves"][k][1] - r["saves"][k][0] for r in reports) for k in range(count)]
    steps = [dict(step=k, rank=r["rank"], t=r["saves"][k][0],
                  wall=r["saves"][k][2] - r["saves"][k][0], input=0.0,
                  checkpoint=r["saves"][k][1] - r["saves"][k][0], h2d=0.0, communication=0.0,
                  compute=r["saves"][k][2] - r["saves"][k][1], other=0.0, samples=0,
                  bytes=r["bytes"]) for r in reports for k in range(count)]
    return dict(
        bytes=total, ranks=len(reports), checkpoints=count, duration_s=duration, steps=steps,
        zerowait=dict(write_mb_per_s=mean_rate("saves", 2) / 1e6,
                      read_mb_per_s=mean_rate("loads", 1) / 1e6,
                      blocking_s=float(np.mean(blocking)), blocking_each_s=blocking),
        torch=dict(write_mb_per_s=total / _span([r["torch_save"] for r in reports]) / 1e6,
                   read_mb_per_s=total / _span([r["torch_load"] for r in reports]) / 1e6,
                   blocking_s=max(r["torch_save"][1] - r["torch_save"][0] for r in reports)))
