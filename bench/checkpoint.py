"""Checkpoint benchmark: zerowait.Checkpointer against torch.save/torch.load, memcpy and fio.

One synthetic training state of >= 2 GiB (a few hundred fp32 and bf16 tensors from KB to
hundreds of MB, plus Adam-like optimizer state) is saved and restored on the same filesystem
(--out), in one process, with each reference measured in the same run:

- blocking time of `save()` (what the training loop waits for) against `torch.save` of the same
  state and against a memcpy of the same bytes into memory that was already touched (what a
  reused, pre-faulted staging pool can reach). The first save of a Checkpointer pre-faults its
  staging pool; the benchmark warms up with one save and measures the second, as a training job's
  every save after the first;
- the CPU a save takes from the cores a training loop shares (every thread, save() until
  durable) against torch.save + fsync's, and in memcpys of the state;
- background write throughput (hash + write + fsync of every file) against fio sequential 1 MiB
  writes of the same size with an fsync at the end (end_fsync=1), buffered, on the same filesystem;
- cold-cache `load()` into new tensors against `torch.load` (both after drop_caches), and cold
  `load(into=...)` of an existing state against fio sequential 1 MiB reads (psync) of a file of
  the same size, with O_DIRECT and buffered (the better of the two is the reference);
- bytes written by an incremental save after changing 10 % of the tensors (chosen at random with
  a fixed seed), against the full save;
- stored size of normally distributed bf16 weights (std 0.02) with zstd, with byte grouping
  (as zerowait stores floating-point tensors) and without (the same bytes saved as int16);
- `load()` and `load(into=...)` against safetensors' `load_file` of the same step's files (they
  are safetensors files), warm (files in the page cache) and cold: load_file with its default
  mmap backend returns before reading anything (the bytes arrive on first touch), so its row
  includes one read of every page; its pread backend reads into new tensors. The faster of the
  two is the reference; zerowait also checks every tensor's xxh3, safetensors checks nothing;
- for information, cold `load()` against `torch.load` of a state of 16,000 tensors of 64 KB.

Each timed row runs --repeat times (default 2) and keeps the best. Ratios, not absolute times,
are the result: this machine is shared and small.

Usage: bench/run checkpoint [--gib 2.1] [--out DIR] [--json FILE] [--repeat N] [--restore-only]
(--restore-only: one save, then only the restore rows against safetensors)
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import resource
import shutil
import sys
import time
from pathlib import Path

import common
from common import MB, log

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


def cpu_seconds():
    """CPU seconds this process has used, all its threads (zerowait's writer's too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def time_torch_save(torch, state, path):
    """(seconds torch.save blocks, seconds to durable, CPU seconds to durable)."""
    cpu = cpu_seconds()
    start = time.perf_counter()
    torch.save(state, path)
    blocked = time.perf_counter() - start
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return blocked, time.perf_counter() - start, cpu_seconds() - cpu


def fio_write(path, size):
    """Sequential 1 MiB buffered writes with an fsync at the end: seconds (job runtime, which
    includes the final fsync), bytes."""
    job = common.run_fio(["--name=write", "--rw=write", "--bs=1M", "--ioengine=psync",
                          "--end_fsync=1", f"--size={size}", f"--filename={path}"])
    return job["job_runtime"] / 1000.0, job["write"]["io_bytes"]


# ---- the run ---------------------------------------------------------------------------------

class Run(common.Results):
    """What every part of the benchmark uses: torch and zerowait, the state, the work folder,
    the page cache, the repeat count, and the table's rows, ratios and notes as they fill."""

    def __init__(self, torch, zerowait, args, out, cache, state):
        super().__init__(args.repeat)
        self.torch, self.zerowait, self.out, self.cache = torch, zerowait, out, cache
        self.state = state
        self.total = state_bytes(state)

    def cold(self, fn):
        """fn() after the page cache is dropped: (seconds, fn's value)."""
        self.cache.drop()
        start = time.perf_counter()
        value = fn()
        return time.perf_counter() - start, value


def measure_saves(run):
    """1. Blocking time of a save against torch.save and memcpy; the background write against
    fio. Returns the Checkpointer, the torch.save file and fio's file, for measure_restores."""
    torch, state, total = run.torch, run.state, run.total
    log("memcpy into touched memory")
    memcpy_s, _ = run.best(lambda: time_memcpy(torch, state))
    run.add_row("memcpy into touched memory (1 thread)", memcpy_s, total)

    log("torch.save")
    torch_path = run.out / "torch.pt"
    torch_save_s, torch_save_fsync_s, torch_save_cpu = run.best(
        lambda: time_torch_save(torch, state, torch_path))
    run.add_row("torch.save (blocking)", torch_save_s, total)
    run.add_row("torch.save + fsync", torch_save_fsync_s, total)

    log("zerowait save (one warm-up save pre-faults the staging pool)")
    ckpt = run.zerowait.Checkpointer(run.out / "zw", keep_last=1)
    ckpt.save(0, state).wait()
    block_s, write_s, bytes_written, save_cpu = None, None, None, None
    for step in range(1, run.repeat + 1):
        cpu = cpu_seconds()
        start = time.perf_counter()
        handle = ckpt.save(step, state)
        blocked = time.perf_counter() - start
        result = handle.wait()
        cpu = cpu_seconds() - cpu
        if block_s is None or blocked < block_s:
            block_s = blocked
        if write_s is None or result["write_s"] < write_s:
            write_s, bytes_written = result["write_s"], result["bytes_written"]
        save_cpu = cpu if save_cpu is None else min(save_cpu, cpu)
    run.add_row("zerowait save() (blocking)", block_s, total)
    run.add_row("zerowait background write (hash+write+fsync)", write_s, bytes_written)
    # The CPU a save takes from the cores a training loop shares: copy, hashes, writes, fsync.
    run.add_row("CPU: zerowait save() to durable (all threads)", save_cpu, total)
    run.add_row("CPU: torch.save + fsync", torch_save_cpu, total)

    log("fio sequential write with fsync")
    fio_path = run.out / "fio.dat"
    fio_write_s, fio_write_bytes = run.best(lambda: fio_write(fio_path, total))
    run.add_row("fio seq write 1 MiB + end_fsync", fio_write_s, fio_write_bytes)

    run.judge("save() blocking / torch.save", block_s / torch_save_s, 0.1,
              higher_is_better=False)
    run.judge("save() blocking / memcpy (touched)", block_s / memcpy_s, 1.5,
              higher_is_better=False)
    run.judge("CPU of a save / torch.save+fsync's", save_cpu / torch_save_cpu, 1.0,
              higher_is_better=False)
    run.notes.append(f"CPU of a save to durable: {save_cpu / memcpy_s:.2f} memcpys of the state "
                     f"(one thread's memcpy is its CPU); torch.save + fsync "
                     f"{torch_save_cpu / memcpy_s:.2f}")
    run.judge("write MB/s / fio write+fsync MB/s",
              (bytes_written / write_s) / (fio_write_bytes / fio_write_s), 0.85,
              higher_is_better=True)
    return ckpt, torch_path, fio_path


def measure_restores(run, ckpt, torch_path, fio_path):
    """2. Cold restores: torch.load, load(), load(into=) and fio's sequential reads of a file of
    the state's size. Closes the Checkpointer and removes the files measure_saves left."""
    total, latest = run.total, ckpt.latest()
    log("cold torch.load")
    torch_load_s, _ = run.best(lambda: run.cold(
        lambda: run.torch.load(torch_path, weights_only=True)))
    run.add_row("torch.load", torch_load_s, total, "cold")

    log("cold zerowait load()")
    load_s, _ = run.best(lambda: run.cold(lambda: ckpt.load(latest)))
    run.add_row("zerowait load() into new tensors", load_s, total, "cold")

    log("cold zerowait load(into=...)")
    into_s, _ = run.best(lambda: run.cold(lambda: ckpt.load(latest, into=run.state)))
    run.add_row("zerowait load(into=existing state)", into_s, total, "cold")

    log("cold fio sequential reads")
    fio_read_mbs = 0.0
    for direct in (True, False):
        # Best of fio's own runtimes, which leave out its set-up.
        seconds, nbytes = run.best(
            lambda: run.cold(lambda: common.fio_seq_read([str(fio_path)], direct))[1])
        fio_read_mbs = max(fio_read_mbs, nbytes / seconds)
        run.add_row(f"fio seq read 1 MiB psync {'O_DIRECT' if direct else 'buffered'}", seconds,
                    nbytes, "cold")

    run.judge("load() speed / torch.load speed", torch_load_s / load_s, 2.0,
              higher_is_better=True)
    run.judge("load(into=) MB/s / best fio seq read MB/s", (total / into_s) / fio_read_mbs, 0.85,
              higher_is_better=True)
    measure_against_safetensors(run, ckpt)
    ckpt.close()
    shutil.rmtree(ckpt.directory, ignore_errors=True)
    torch_path.unlink(missing_ok=True)
    fio_path.unlink(missing_ok=True)


def step_files(ckpt, step):
    return sorted(str(p) for p in (Path(ckpt.directory) / f"step-{step}").glob("*.safetensors"))


def read_files_once(paths):
    """Reads every byte of `paths` through the page cache (a warm-up, like cat)."""
    buffer = bytearray(8 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def safetensors_load(torch, paths, backend):
    """safetensors.torch.load_file of every file; with the mmap backend, then one read of every
    page (load_file maps the files and returns before any byte is read)."""
    from safetensors.torch import load_file

    tensors = {}
    for path in paths:
        tensors.update(load_file(path, backend=backend))
    if backend == "mmap":
        for t in tensors.values():
            if t.numel():
                t.reshape(-1).view(torch.uint8)[::4096].sum()
    return tensors


def measure_against_safetensors(run, ckpt):
    """load() and load(into=) against safetensors load_file on the same files, warm and cold."""
    torch, total, latest = run.torch, run.total, ckpt.latest()
    paths = step_files(ckpt, latest)
    peers = {}
    for cache_state in ("warm", "cold"):
        def timed(fn):
            """(seconds,): what fn() returned is dropped at once, so that no mapping of the
            files outlives its row (mapped pages cannot be evicted for the next cold run)."""
            if cache_state == "cold":
                return run.cold(fn)[0],
            read_files_once(paths)
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start,

        best_peer, by_backend = None, {}
        for backend in ("mmap", "pread"):
            log(f"{cache_state} safetensors load_file ({backend})")
            seconds, = run.best(lambda: timed(lambda: safetensors_load(torch, paths, backend)))
            label = "+ first read of every page" if backend == "mmap" else "into new tensors"
            run.add_row(f"safetensors load_file {backend} {label}", seconds, total, cache_state)
            best_peer = seconds if best_peer is None else min(best_peer, seconds)
            by_backend[backend] = seconds
        log(f"{cache_state} zerowait load() and load(into=)")
        load_s, = run.best(lambda: timed(lambda: ckpt.load(latest)))
        run.add_row("zerowait load() into new tensors (verified)", load_s, total, cache_state)
        mmap_s, = run.best(lambda: timed(lambda: ckpt.load(latest, mmap=True)))
        run.add_row("zerowait load(mmap=True) (verified)", mmap_s, total, cache_state)
        into_s, = run.best(lambda: timed(lambda: ckpt.load(latest, into=run.state)))
        run.add_row("zerowait load(into=existing state) (verified)", into_s, total, cache_state)
        run.judge(f"faster load() / faster safetensors load_file, speed ({cache_state})",
                  best_peer / min(load_s, mmap_s), 1.0, higher_is_better=True)
        peers[cache_state] = (best_peer, into_s)
        run.notes.append(f"load() is {by_backend['pread'] / load_s:.2f}x as fast as load_file "
                         f"with backend=pread, which also fills new tensors, and load(mmap=True) "
                         f"{by_backend['mmap'] / mmap_s:.2f}x as fast as load_file's mmap, which "
                         f"maps alike and verifies nothing ({cache_state}, not judged)")
    for cache_state, (peer_s, into_s) in peers.items():
        run.notes.append(f"load(into=) is {peer_s / into_s:.2f}x as fast as the faster "
                         f"safetensors load_file ({cache_state}, not judged)")
    run.notes.append(f"safetensors load_file read the step's {len(paths)} tensor files")


def measure_restore_only(run):
    """--restore-only: one save, then the rows against safetensors."""
    log("zerowait save (for the restore rows)")
    ckpt = run.zerowait.Checkpointer(run.out / "zw", keep_last=1)
    ckpt.save(0, run.state).wait()
    measure_against_safetensors(run, ckpt)
    ckpt.close()
    shutil.rmtree(ckpt.directory, ignore_errors=True)


def measure_incremental(run):
    """3. An incremental save after changing 10 % of the tensors, against the full save."""
    log("incremental save")
    inc = run.zerowait.Checkpointer(run.out / "inc", keep_last=2, incremental=True)
    full = inc.save(1, run.state).wait()
    tensors = list(tensors_of(run.state))
    changed = random.Random(5).sample(range(len(tensors)), k=max(1, len(tensors) // 10))
    changed_bytes = 0
    for i in changed:
        tensors[i].add_(1)
        changed_bytes += tensors[i].numel() * tensors[i].element_size()
    partial = inc.save(2, run.state).wait()
    inc.close()
    run.notes.append(f"incremental: {len(changed)} of {len(tensors)} tensors changed, "
                     f"{changed_bytes / run.total:.1%} of the bytes; the save wrote "
                     f"{partial['bytes_written'] / MB:.0f} MB of "
                     f"{full['bytes_written'] / MB:.0f} MB, and referenced "
                     f"{partial['tensors_referenced']} tensors")
    run.judge("incremental bytes / full bytes (10% changed)",
              partial["bytes_written"] / full["bytes_written"], 0.15, higher_is_better=False)
    shutil.rmtree(inc.directory, ignore_errors=True)


def measure_compression(run):
    """4. Normally distributed bf16 weights with zstd, with and without byte grouping."""
    torch = run.torch
    log("bf16 compression")
    gen = torch.Generator().manual_seed(3)
    weights = (torch.randn(64 << 20, generator=gen) * 0.02).to(torch.bfloat16)
    raw = weights.numel() * 2
    stored = {}
    for label, value in (("grouped", weights), ("plain", weights.view(torch.int16))):
        ckpt = run.zerowait.Checkpointer(run.out / f"zstd-{label}", compression="zstd")
        stored[label] = ckpt.save(1, {"w": value}).wait()["bytes_written"]
        ckpt.close()
        shutil.rmtree(ckpt.directory, ignore_errors=True)
    run.notes.append(f"bf16 N(0, 0.02), {raw / MB:.0f} MB raw: zstd with byte grouping "
                     f"{stored['grouped'] / MB:.1f} MB, without {stored['plain'] / MB:.1f} MB")
    run.judge("bf16 zstd+byte grouping / raw", stored["grouped"] / raw, 0.85,
              higher_is_better=False)


def measure_small_tensors(run):
    """5. For information: a state of many small tensors, where torch.load's per-record cost
    shows."""
    torch = run.torch
    log("many small tensors: cold torch.load and load()")
    small = {"model": {f"layers.{i}.weight": torch.randn(16384) for i in range(16000)}}
    small_bytes = state_bytes(small)
    small_path = run.out / "small.pt"
    torch.save(small, small_path)
    ckpt = run.zerowait.Checkpointer(run.out / "small")
    ckpt.save(1, small).wait()
    torch_s, _ = run.best(lambda: run.cold(lambda: torch.load(small_path, weights_only=True)))
    zerowait_s, _ = run.best(lambda: run.cold(lambda: ckpt.load(1)))
    run.add_row("torch.load, 16,000 x 64 KB tensors", torch_s, small_bytes, "cold")
    run.add_row("zerowait load(), 16,000 x 64 KB tensors", zerowait_s, small_bytes, "cold")
    run.notes.append(f"many small tensors (not judged): load() is {torch_s / zerowait_s:.2f}x "
                     "as fast as torch.load")
    ckpt.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=2.1, help="size of the training state")
    parser.add_argument("--out", default=str(common.DEFAULT_OUT / "checkpoint"),
                        help="work directory (on the filesystem to measure)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--repeat", type=int, default=2, help="runs per timed row (best kept)")
    parser.add_argument("--restore-only", action="store_true",
                        help="only the restore rows against safetensors (one save first)")
    args = parser.parse_args()

    import torch
    import zerowait

    if shutil.which("fio") is None:
        sys.exit("bench: fio is not installed (apt-get install fio)")
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cache = common.Cache(lambda: [str(p) for p in out.rglob("*") if p.is_file()])
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    log(f"building a {args.gib:.1f} GiB state")
    run = Run(torch, zerowait, args, out, cache, synthetic_state(torch, int(args.gib * GiB)))
    ntensors = sum(1 for _ in tensors_of(run.state))
    log(f"state: {ntensors} tensors, {run.total / GiB:.2f} GiB")
    if args.restore_only:
        measure_restore_only(run)
    else:
        measure_restores(run, *measure_saves(run))
        measure_incremental(run)
        measure_compression(run)
        measure_small_tensors(run)

    run.notes.append(f"state: {ntensors} tensors, {run.total / GiB:.2f} GiB; torch "
                     f"{torch.__version__}; page cache dropped with {cache.method}; best of "
                     f"{args.repeat} runs per row")
    status = run.report(args.json)
    shutil.rmtree(out, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
