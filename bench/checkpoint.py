"""Checkpoint benchmark: zerowait.Checkpointer against torch.save/torch.load, memcpy and fio.

One synthetic training state of >= 2 GiB (a few hundred fp32 and bf16 tensors from KB to
hundreds of MB, plus Adam-like optimizer state) is saved and restored on the same filesystem
(--out), in one process, with each reference measured in the same run:

- blocking time of `save()` (what the training loop waits for) against `torch.save` of the same
  state and against a memcpy of the same bytes into memory that was already touched (what a
  reused, pre-faulted staging pool can reach). The first save of a Checkpointer pre-faults its
  staging pool; the benchmark warms up with one save and measures the second, as a training job's
  every save after the first;
- background write throughput (hash + write + fsync of every file) against fio sequential 1 MiB
  writes of the same size with an fsync at the end (end_fsync=1), buffered, on the same filesystem;
- cold-cache `load()` into new tensors against `torch.load` (both after drop_caches), and cold
  `load(into=...)` of an existing state against fio sequential 1 MiB reads (psync) of a file of
  the same size, with O_DIRECT and buffered (the better of the two is the reference);
- bytes written by an incremental save after changing 10 % of the tensors (chosen at random with
  a fixed seed), against the full save;
- stored size of normally distributed bf16 weights (std 0.02) with zstd, with byte grouping
  (as zerowait stores floating-point tensors) and without (the same bytes saved as int16);
- for information, cold `load()` against `torch.load` of a state of 16,000 tensors of 64 KB.

Each timed row runs --repeat times (default 2) and keeps the best. Ratios, not absolute times,
are the result: this machine is shared and small.

Usage: bench/run checkpoint [--gib 2.1] [--out DIR] [--json FILE] [--repeat N]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pack_read  # noqa: E402  (cache dropping, fio output parsing, the table)
from pack_read import MB, REPO, log  # noqa: E402

GiB = 1 << 30


def synthetic_state(torch, total_bytes, seed=11):
    """A model (fp32 master weights and a bf16 copy) and Adam state (exp_avg, exp_avg_sq) whose
    tensors range from KB to hundreds of MB, about `total_bytes` in all."""
    rng = random.Random(seed)
    # Parameter element counts: log-uniform from 256 to 16M, plus a few large matrices.
    counts = [int(2 ** rng.uniform(8, 24)) for _ in range(120)]
    counts += [1 << 24, 3 << 23, 1 << 25]
    scale = total_bytes / (sum(counts) * (4 + 2 + 4 + 4))  # fp32 + bf16 + two fp32 moments
    counts = [max(64, int(c * scale)) for c in counts]
    gen = torch.Generator().manual_seed(seed)
    model, model_bf16, exp_avg, exp_avg_sq = {}, {}, {}, {}
    for i, n in enumerate(counts):
        name = f"layers.{i}.weight"
        w = torch.randn(n, generator=gen) * 0.02
        model[name] = w
        model_bf16[name] = w.to(torch.bfloat16)
        exp_avg[i] = torch.randn(n, generator=gen) * 1e-3
        exp_avg_sq[i] = torch.rand(n, generator=gen) * 1e-6
    optimizer = {"state": {i: {"step": torch.tensor(1000.0), "exp_avg": exp_avg[i],
                               "exp_avg_sq": exp_avg_sq[i]} for i in exp_avg},
                 "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.999), "eps": 1e-8,
                                   "weight_decay": 0.1, "params": list(exp_avg)}]}
    return {"model": model, "model_bf16": model_bf16, "optimizer": optimizer, "step": 1000,
            "rng_seed": seed}


def tensors_of(obj):
    if hasattr(obj, "data_ptr"):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_of(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_of(v)


def state_bytes(state):
    return sum(t.numel() * t.element_size() for t in tensors_of(state))


def best_of(repeat, fn):
    """Runs fn() `repeat` times; returns the result with the smallest first element."""
    best = None
    for _ in range(repeat):
        result = fn()
        if best is None or result[0] < best[0]:
            best = result
    return best


# ---- references ------------------------------------------------------------------------------

def time_memcpy(torch, state):
    """One thread copying every tensor's bytes into one buffer that was touched before."""
    tensors = list(tensors_of(state))
    total = sum(t.numel() * t.element_size() for t in tensors)
    dst = torch.empty(total, dtype=torch.uint8)
    dst.fill_(1)  # touched: no first-touch page faults while timing
    base = dst.data_ptr()
    start = time.perf_counter()
    offset = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        ctypes.memmove(base + offset, t.data_ptr(), n)
        offset += n
    return time.perf_counter() - start, total


def time_torch_save(torch, state, path):
    start = time.perf_counter()
    torch.save(state, path)
    blocked = time.perf_counter() - start
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return blocked, time.perf_counter() - start


def fio(args):
    out = pack_read.run(["fio", "--output-format=json", *args])
    job = pack_read.parse_json_output(out, "fio")["jobs"][0]
    if job.get("error"):
        sys.exit(f"bench: fio reported error {job['error']}")
    return job


def fio_write(path, size):
    """Sequential 1 MiB buffered writes with an fsync at the end: seconds (job runtime, which
    includes the final fsync), bytes."""
    job = fio(["--name=write", "--rw=write", "--bs=1M", "--ioengine=psync", "--end_fsync=1",
               f"--size={size}", f"--filename={path}"])
    return job["job_runtime"] / 1000.0, job["write"]["io_bytes"]


def fio_read(path, direct):
    job = fio(["--name=read", "--rw=read", "--bs=1M", "--ioengine=psync",
               f"--direct={1 if direct else 0}", "--invalidate=0", "--readonly",
               f"--filename={path}"])
    return max(job["read"]["runtime"], 1) / 1000.0, job["read"]["io_bytes"]


# ---- the run ---------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=2.1, help="size of the training state")
    parser.add_argument("--out", default=str(REPO / "bench" / "out" / "checkpoint"),
                        help="work directory (on the filesystem to measure)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--repeat", type=int, default=2, help="runs per timed row (best kept)")
    args = parser.parse_args()

    import torch
    import zerowait

    if shutil.which("fio") is None:
        sys.exit("bench: fio is not installed (apt-get install fio)")
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cache = pack_read.Cache(lambda: [str(p) for p in out.rglob("*") if p.is_file()])
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    log(f"building a {args.gib:.1f} GiB state")
    state = synthetic_state(torch, int(args.gib * GiB))
    total = state_bytes(state)
    ntensors = sum(1 for _ in tensors_of(state))
    log(f"state: {ntensors} tensors, {total / GiB:.2f} GiB")
    rows, ratios, notes = [], [], []

    def add_row(name, seconds, nbytes, cache_state="-"):
        rows.append({"name": name, "cache": cache_state, "seconds": seconds, "bytes": nbytes,
                     "mb_per_s": nbytes / seconds / MB, "samples_per_s": None})

    # 1. Blocking time of a save.
    log("memcpy into touched memory")
    memcpy_s, _ = best_of(args.repeat, lambda: time_memcpy(torch, state))
    add_row("memcpy into touched memory (1 thread)", memcpy_s, total)

    log("torch.save")
    torch_path = out / "torch.pt"
    torch_save_s, torch_save_fsync_s = best_of(
        args.repeat, lambda: time_torch_save(torch, state, torch_path))
    add_row("torch.save (blocking)", torch_save_s, total)
    add_row("torch.save + fsync", torch_save_fsync_s, total)

    log("zerowait save (one warm-up save pre-faults the staging pool)")
    ckpt_dir = out / "zw"
    ckpt = zerowait.Checkpointer(ckpt_dir, keep_last=1)
    ckpt.save(0, state).wait()
    block_s, write_s, bytes_written = None, None, None
    for step in range(1, args.repeat + 1):
        start = time.perf_counter()
        handle = ckpt.save(step, state)
        blocked = time.perf_counter() - start
        result = handle.wait()
        if block_s is None or blocked < block_s:
            block_s = blocked
        if write_s is None or result["write_s"] < write_s:
            write_s, bytes_written = result["write_s"], result["bytes_written"]
    add_row("zerowait save() (blocking)", block_s, total)
    add_row("zerowait background write (hash+write+fsync)", write_s, bytes_written)

    log("fio sequential write with fsync")
    fio_path = out / "fio.dat"
    fio_write_s, fio_write_bytes = best_of(args.repeat, lambda: fio_write(fio_path, total))
    add_row("fio seq write 1 MiB + end_fsync", fio_write_s, fio_write_bytes)

    ratios.append(pack_read.ratio("save() blocking / torch.save", block_s / torch_save_s, 0.1,
                                  higher_is_better=False))
    ratios.append(pack_read.ratio("save() blocking / memcpy (touched)", block_s / memcpy_s, 1.5,
                                  higher_is_better=False))
    ratios.append(pack_read.ratio("write MB/s / fio write+fsync MB/s",
                                  (bytes_written / write_s) / (fio_write_bytes / fio_write_s), 0.85,
                                  higher_is_better=True))

    # 2. Cold restores.
    latest = ckpt.latest()

    def cold(fn):
        cache.drop()
        start = time.perf_counter()
        value = fn()
        return time.perf_counter() - start, value

    log("cold torch.load")
    torch_load_s, _ = best_of(args.repeat, lambda: cold(
        lambda: torch.load(torch_path, weights_only=True)))
    add_row("torch.load", torch_load_s, total, "cold")

    log("cold zerowait load()")
    load_s, _ = best_of(args.repeat, lambda: cold(lambda: ckpt.load(latest)))
    add_row("zerowait load() into new tensors", load_s, total, "cold")

    log("cold zerowait load(into=...)")
    into_s, _ = best_of(args.repeat, lambda: cold(lambda: ckpt.load(latest, into=state)))
    add_row("zerowait load(into=existing state)", into_s, total, "cold")

    log("cold fio sequential reads")
    fio_read_rows = {}
    for direct in (True, False):
        seconds, nbytes = best_of(args.repeat, lambda: cold(lambda: fio_read(fio_path, direct))[1])
        fio_read_rows[direct] = (seconds, nbytes)
        add_row(f"fio seq read 1 MiB psync {'O_DIRECT' if direct else 'buffered'}", seconds,
                nbytes, "cold")
    fio_read_mbs = max(n / s for s, n in fio_read_rows.values())

    ratios.append(pack_read.ratio("load() speed / torch.load speed", torch_load_s / load_s, 2.0,
                                  higher_is_better=True))
    ratios.append(pack_read.ratio("load(into=) MB/s / best fio seq read MB/s",
                                  (total / into_s) / fio_read_mbs, 0.85, higher_is_better=True))
    ckpt.wait()
    del ckpt
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    torch_path.unlink(missing_ok=True)
    fio_path.unlink(missing_ok=True)

    # 3. Incremental save after changing 10 % of the tensors.
    log("incremental save")
    inc = zerowait.Checkpointer(out / "inc", keep_last=2, incremental=True)
    full = inc.save(1, state).wait()
    tensors = list(tensors_of(state))
    changed = random.Random(5).sample(range(len(tensors)), k=max(1, len(tensors) // 10))
    changed_bytes = 0
    for i in changed:
        tensors[i].add_(1)
        changed_bytes += tensors[i].numel() * tensors[i].element_size()
    partial = inc.save(2, state).wait()
    inc.wait()
    inc_fraction = partial["bytes_written"] / full["bytes_written"]
    notes.append(f"incremental: {len(changed)} of {len(tensors)} tensors changed, "
                 f"{changed_bytes / total:.1%} of the bytes; the save wrote "
                 f"{partial['bytes_written'] / MB:.0f} MB of {full['bytes_written'] / MB:.0f} MB, "
                 f"and referenced {partial['tensors_referenced']} tensors")
    ratios.append(pack_read.ratio("incremental bytes / full bytes (10% changed)", inc_fraction,
                                  0.15, higher_is_better=False))
    del inc
    shutil.rmtree(out / "inc", ignore_errors=True)

    # 4. bf16 weights with zstd, with and without byte grouping.
    log("bf16 compression")
    gen = torch.Generator().manual_seed(3)
    weights = (torch.randn(64 << 20, generator=gen) * 0.02).to(torch.bfloat16)
    raw = weights.numel() * 2
    stored = {}
    for label, value in (("grouped", weights), ("plain", weights.view(torch.int16))):
        directory = out / f"zstd-{label}"
        c = zerowait.Checkpointer(directory, compression="zstd")
        stored[label] = c.save(1, {"w": value}).wait()["bytes_written"]
        c.wait()
        del c
        shutil.rmtree(directory, ignore_errors=True)
    notes.append(f"bf16 N(0, 0.02), {raw / MB:.0f} MB raw: zstd with byte grouping "
                 f"{stored['grouped'] / MB:.1f} MB, without {stored['plain'] / MB:.1f} MB")
    ratios.append(pack_read.ratio("bf16 zstd+byte grouping / raw", stored["grouped"] / raw, 0.85,
                                  higher_is_better=False))

    # 5. For information: a state of many small tensors, where torch.load's per-record cost shows.
    log("many small tensors: cold torch.load and load()")
    small = {"model": {f"layers.{i}.weight": torch.randn(16384) for i in range(16000)}}
    small_bytes = state_bytes(small)
    small_path = out / "small.pt"
    torch.save(small, small_path)
    small_ckpt = zerowait.Checkpointer(out / "small")
    small_ckpt.save(1, small).wait()
    small_torch_s, _ = best_of(args.repeat, lambda: cold(
        lambda: torch.load(small_path, weights_only=True)))
    small_zw_s, _ = best_of(args.repeat, lambda: cold(lambda: small_ckpt.load(1)))
    add_row("torch.load, 16,000 x 64 KB tensors", small_torch_s, small_bytes, "cold")
    add_row("zerowait load(), 16,000 x 64 KB tensors", small_zw_s, small_bytes, "cold")
    notes.append(f"many small tensors (not judged): load() is {small_torch_s / small_zw_s:.2f}x "
                 "as fast as torch.load")
    del small, small_ckpt

    notes.append(f"state: {ntensors} tensors, {total / GiB:.2f} GiB; torch {torch.__version__}; "
                 f"page cache dropped with {cache.method}; best of {args.repeat} runs per row")
    pack_read.print_table(rows, ratios, notes)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "ratios": ratios, "notes": notes},
                                              indent=2))
    shutil.rmtree(out, ignore_errors=True)
    return 0 if all(r["result"] == "PASS" for r in ratios) else 1


if __name__ == "__main__":
    sys.exit(main())
