"""One training emulation of ``zerowait emulate``: N rank processes, each with its own input
pipeline over its partition of the data set, and the accelerator replaced by a sleep.

Each step is DLIO's: t0, next batch, t1, sleep(compute), t2. The AU arithmetic follows DLIO's
StatsCounter (github.com/argonne-lcf/dlio_benchmark, dlio_benchmark/utils/statscounter.py,
compute_metrics_train and end_run), which MLPerf Storage runs:

- per rank, AU = the compute time of the steps it counts / the wall time they span, where the
  first step of the epoch is left out (metric_exclude_start_steps = 1, _end_steps = 0: the
  pipeline's start-up is not the storage's throughput);
- the run's AU is the mean of the ranks' AUs (DLIO: allreduce sum / comm size), and it passes
  when it reaches the workload's floor (metric.au);
- samples/s is the sum of the ranks' samples/s over the same steps. DLIO counts (steps - 2)
  batches there and gives MB/s as samples/s x the mean record length / 2**20; here the counted
  steps' batches are used, and MB/s is the bytes those batches really held / 10**6.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
import warnings
from typing import Dict, List

import numpy as np

from zerowait._emulate_workloads import FIELD, data_files, evict, measure_page_cache

# Seconds a rank may take to build its pipeline before the run is abandoned.
SETUP_TIMEOUT = 300


class _FileRecords:
    """torch map-style dataset over the plain files: sample i is record i % per_file of file
    i // per_file (records of ``record`` bytes, back to back), read with open/pread/close, as a
    per-file reader does."""

    def __init__(self, files: List[str], per_file: int, samples: int, record: int) -> None:
        self.files, self.per_file, self.samples, self.record = files, per_file, samples, record

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        import torch

        path = self.files[index // self.per_file]
        fd = os.open(path, os.O_RDONLY)
        try:
            if self.per_file == 1:
                data = _read_all(fd, os.fstat(fd).st_size, 0, path)
            else:
                data = _read_all(fd, self.record, self.record * (index % self.per_file), path)
        finally:
            os.close(fd)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _read_all(fd: int, size: int, offset: int, path: str) -> bytes:
    parts, done = [], 0
    while done < size:
        chunk = os.pread(fd, size - done, offset + done)
        if not chunk:
            raise OSError(f"{path}: file ends at offset {offset + done}, expected {size} bytes")
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def _collate(samples):
    """Ragged samples into one uint8 tensor plus offsets, the shape zerowait.Loader gives."""
    import torch

    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor([len(s) for s in samples]).cumsum(0)
    return {FIELD: torch.cat(samples), FIELD + ".offsets": offsets}


def _make_input(spec: Dict, rank: int, world: int):
    """An iterator of batches for this rank, and how many it gives."""
    if spec["input"] == "zerowait":
        import zerowait

        threads = spec["workers"] or os.cpu_count() or 1
        arenas = threads + zerowait.loader._DEFAULTS["prefetch"] + 2
        loader = zerowait.Loader(
            os.path.join(spec["data"], "zerowait"), spec["batch"], shuffle=spec["shuffle"],
            seed=spec["seed"], rank=rank, world_size=world, drop_last=True,
            threads=spec["workers"] or None, output="numpy",
            # The loader keeps threads + prefetch + 2 arenas, each holding a raw batch twice
            # (read buffer and output; src/loader/loader.cpp): room for the largest batch.
            memory_budget=max(512 << 20, arenas * 2 * spec["largest_batch_bytes"] * 9 // 8))
        return iter(loader), len(loader)
    import torch.utils.data as tud

    # --workers is the user's (MLPerf's read_threads), beyond this machine's CPUs on purpose.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    files = data_files(spec["data"], "files")
    dataset = _FileRecords(files, spec["samples_per_file"], spec["samples"],
                           spec["sample_bytes"])
    sampler = tud.DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                     seed=spec["seed"], drop_last=True)
    loader = tud.DataLoader(dataset, batch_size=spec["batch"], sampler=sampler,
                            num_workers=spec["workers"], collate_fn=_collate, drop_last=True)
    return iter(loader), len(loader)


def _rank_main(rank: int, spec: Dict, barrier, results) -> None:
    try:
        batches, available = _make_input(spec, rank, spec["accelerators"])
        steps = min(spec["steps"], available)
        barrier.wait(SETUP_TIMEOUT)
        log = []
        compute = spec["compute"]
        for _ in range(steps):
            t0 = time.monotonic()
            batch = next(batches)
            t1 = time.monotonic()
            time.sleep(compute)
            t2 = time.monotonic()
            offsets = batch[FIELD + ".offsets"]
            log.append((t0, t1, t2, len(offsets) - 1, int(offsets[-1])))
            del batch
        results.put(("ok", rank, log, time.monotonic()))
    except BaseException as error:  # reported by the parent, which names the rank
        results.put(("error", rank, f"{type(error).__name__}: {error}\n"
                     f"{traceback.format_exc(limit=4)}", 0.0))
        barrier.abort()  # the other ranks stop waiting (BrokenBarrierError)


def run(spec: Dict, log) -> Dict:
    """Runs one configuration (spec: data, input, accelerators, batch, compute, steps, workers,
    seed, warm, the data set's numbers) and returns its steps per rank and metrics. Raises
    RuntimeError naming the rank that failed."""
    world = spec["accelerators"]
    files = data_files(spec["data"], spec["input"])
    evicted = None
    if not spec["warm"]:
        evicted = evict(files)
    page_cache = measure_page_cache(files)  # what the run starts from, whatever was asked
    # Forked, so that N ranks do not each import torch again; the parent has started no
    # threads of zerowait or torch by now.
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(world + 1)
    results = context.Queue()
    # Not daemonic: a rank's DataLoader starts worker processes of its own.
    ranks = [context.Process(target=_rank_main, args=(r, spec, barrier, results))
             for r in range(world)]
    for process in ranks:
        process.start()
    start = time.monotonic()
    try:
        barrier.wait(SETUP_TIMEOUT)
        start = time.monotonic()
    except Exception:
        pass  # a rank failed before its first step; its report follows
    reports = gather(ranks, results, f"{spec['input']} input, {world} accelerators")
    by_rank = {rank: report[0] for rank, report in reports.items()}
    ends = {rank: report[1] for rank, report in reports.items()}
    steps = steps_log(by_rank)
    metrics = metrics_of(steps, world)
    metrics.update(duration_s=max(ends.values()) - start, evicted=evicted, page_cache=page_cache,
                   steps=steps)
    return metrics


def gather(ranks: List, results, label: str) -> Dict[int, List]:
    """Each rank's report, ("ok", rank, *report) on ``results``, by rank, once every rank has
    reported or died; then joins them. Raises RuntimeError, ``label`` first, naming the rank that
    failed first (an error it sent, or its exit status when it died without a word)."""
    reports: Dict[int, List] = {}
    errors: List[str] = []
    while len(reports) + len(errors) < len(ranks):
        try:
            status, rank, *report = results.get(timeout=5)
        except Exception:
            dead = [r for r, p in enumerate(ranks) if not p.is_alive() and r not in reports]
            if dead and results.empty():
                errors.append(f"rank {dead[0]} exited with status {ranks[dead[0]].exitcode} "
                              "without a report")
                break
            continue
        if status == "ok":
            reports[rank] = report
        else:
            errors.append(f"rank {rank}: {report[0]}")
    for process in ranks:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join()
    if errors:
        # The rank that failed first, not those it left waiting at a barrier.
        errors.sort(key=lambda e: "BrokenBarrierError" in e)
        raise RuntimeError(f"{label}: " + errors[0])
    return reports


def steps_log(by_rank: Dict[int, List]) -> List[Dict]:
    """The step records of docs/observe.md: wall runs from a step's start to the next step's
    start (the last step: to its end); input, compute and other sum to it."""
    out = []
    for rank in sorted(by_rank):
        rows = by_rank[rank]
        for i, (t0, t1, t2, samples, nbytes) in enumerate(rows):
            end = rows[i + 1][0] if i + 1 < len(rows) else t2
            wall = end - t0
            out.append(dict(step=i, rank=rank, t=t0, wall=wall, input=t1 - t0, checkpoint=0.0,
                            h2d=0.0, communication=0.0, compute=t2 - t1,
                            other=max(0.0, wall - (t2 - t0)), samples=samples, bytes=nbytes))
    return out


def metrics_of(steps: List[Dict], world: int) -> Dict:
    """AU per rank and overall, samples/s and MB/s, by the rule in this module's docstring."""
    per_rank = []
    for rank in range(world):
        counted = [s for s in steps if s["rank"] == rank and s["step"] >= 1]
        wall = sum(s["wall"] for s in counted)
        compute = sum(s["compute"] for s in counted)
        per_rank.append(dict(
            rank=rank, steps=len(counted), au=compute / wall if wall > 0 else 0.0,
            samples_per_s=sum(s["samples"] for s in counted) / wall if wall > 0 else 0.0,
            mb_per_s=sum(s["bytes"] for s in counted) / wall / 1e6 if wall > 0 else 0.0))
    return dict(
        au=float(np.mean([r["au"] for r in per_rank])) if per_rank else 0.0,
        samples_per_s=sum(r["samples_per_s"] for r in per_rank),
        mb_per_s=sum(r["mb_per_s"] for r in per_rank),
        counted_steps=sum(r["steps"] for r in per_rank), ranks=per_rank)
