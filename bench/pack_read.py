#!/usr/bin/env python3
"""Pack and read benchmark: zerowait shards against the references that bound them, in one run.

What is measured, on one synthetic ImageFolder tree of N real JPEGs (10-60 KB each):

(a) Packing. `zerowait pack TREE -o OUT --imagefolder` against `tar -cf X.tar -C TREE .`: both
    read every file once and write one copy of the bytes. Pack also checks every JPEG's structure
    and fsyncs its shards, so tar's time includes an fsync of the tar file too (both end durable).
    Pack uses all CPUs, tar one: that is what each tool does when a user runs it. The tree is read
    once before (warm page cache); each tool runs twice and the best time counts. A cold variant
    (caches dropped before each run, one run each) is reported for information.

(b) Reading every sample once, in order:
    - shards: `zw_bench_read shards` opens the dataset (manifest + one index per shard) and reads
      every shard with ShardReader::scan: 512 KiB of consecutive samples per read, the next 32 MiB
      hinted ahead (POSIX_FADV_WILLNEED), touching one byte per 4 KiB of every sample.
    - files: `zw_bench_read files` opens, fstats, reads and closes every file in sorted order, as
      a per-file PyTorch Dataset does, into the same kind of buffer. Listing the tree is not timed
      (ImageFolder lists once, at construction).
    - cat: `cat SHARDS/*.zws > /dev/null`, the page-cache limit for the same bytes.
    - fio: one job, psync, sequential 1 MiB reads of the same shard files one after the other
      (file_service_type=sequential), buffered (direct=0) like zerowait's pread path, and
      invalidate=0 so fio does not evict the cache itself; fio with O_DIRECT is shown as the raw
      storage limit.
    - The per-file reference is C (no Python, no decode): the cheapest a per-file loader can be,
      so the shards/files ratio is a lower bound of what a Python DataLoader user would gain.
    - python per-file: a per-file PyTorch-style Dataset in this Python (`__init__` walks the
      tree, `__getitem__` opens/reads/closes), iterated index by index without a DataLoader. Its
      time includes the walk, as a job starting on a cold cache pays it; zerowait's includes
      opening the dataset likewise.
    Warm: one run to fill the cache, then the best of 5. Cold: the page cache is dropped
    (`sync; echo 3 > /proc/sys/vm/drop_caches`) before each run, best of 3. Repeats go
    round-robin over the rows, so a slow spell of this shared machine hits every row alike.
    Where dropping caches is not permitted, the files are evicted with posix_fadvise(DONTNEED)
    instead (inode and dentry caches then stay warm, which flatters the per-file reference) and
    the table says so.

Why the comparison is fair: every row reads the same bytes from the same files on the same
machine within minutes of each other, and only ratios measured in this run are judged, never bare
times (this machine is shared and noisy). Where timing choices differ they favour the references:
zerowait's time includes opening the dataset and reading its indexes but not process start-up or
faulting in its reused buffer (a loader pays those once per process, not per epoch); cat's time is
its wall-clock time minus that of `cat /dev/null` (process start-up); fio's is fio's own runtime,
which leaves out its set-up entirely.

Goals (PASS/FAIL, printed with --judge or --strict): pack/tar time <= 2.0; warm shards/cat MB/s
>= 0.90; cold shards/fio MB/s >= 0.85; cold shards/files samples/s >= 10. Without either, the
ratios are printed as measurements: the goals are the project's, not a verdict on a machine.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import common
from common import MB, log, run


def wall(cmd):
    """Wall-clock seconds of running `cmd` (its output discarded)."""
    start = time.perf_counter()
    run(cmd, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


# ---- (a) pack vs tar -----------------------------------------------------------------------------

def time_pack(zerowait, tree, shards):
    shutil.rmtree(shards, ignore_errors=True)
    return wall([zerowait, "pack", str(tree), "-o", str(shards), "--imagefolder"])


def time_tar(tree, tar_path):
    if tar_path.exists():
        tar_path.unlink()
    start = time.perf_counter()
    run(["tar", "-cf", str(tar_path), "-C", str(tree), "."], stdout=subprocess.DEVNULL)
    fd = os.open(tar_path, os.O_RDONLY)
    try:
        os.fsync(fd)  # pack fsyncs its shards; tar's copy must be as durable to compare
    finally:
        os.close(fd)
    return time.perf_counter() - start


# ---- (b) reads -----------------------------------------------------------------------------------

def shard_files(shards):
    files = common.shard_paths(shards)
    if not files:
        sys.exit(f"bench: no .zws shards in {shards}")
    return files


def read_shards(bench_read, shards):
    r = common.parse_json_output(run([bench_read, "shards", str(shards)]),
                                 "zw_bench_read shards")
    return r["seconds"], r["bytes"], r["samples"]


def read_files(bench_read, tree):
    r = common.parse_json_output(run([bench_read, "files", str(tree)]), "zw_bench_read files")
    return r["seconds"], r["bytes"], r["samples"]


PER_FILE_DATASET = """
import json, os, sys, time
class FilesDataset:  # what a per-file PyTorch Dataset does
    def __init__(self, root):
        self.paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
    def __len__(self):
        return len(self.paths)
    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return f.read()
start = time.perf_counter()
ds = FilesDataset(sys.argv[1])
nbytes = sum(len(ds[i]) for i in range(len(ds)))
print(json.dumps({"seconds": time.perf_counter() - start, "bytes": nbytes, "samples": len(ds)}))
"""


def read_files_python(tree):
    out = run([sys.executable, "-c", PER_FILE_DATASET, str(tree)])
    result = common.parse_json_output(out, "python per-file dataset")
    return result["seconds"], result["bytes"], result["samples"]


def cat_startup():
    return min(wall(["cat", "/dev/null"]) for _ in range(5))


def read_cat(shards, startup):
    files = shard_files(shards)
    seconds = max(wall(["cat", *files]) - startup, 1e-9)
    return seconds, common.total_bytes(files), None


def read_fio(shards, direct):
    return (*common.fio_seq_read(shard_files(shards), direct), None)


# The read rows' names in the table, by the key the ratios use.
READ_ROWS = {
    "shards": "zerowait shards (scan, 512 KiB + prefetch)",
    "files": "per-file open/read/close (C)",
    "python": "per-file Python Dataset (open/read/close)",
    "cat": "cat SHARDS/*.zws > /dev/null",
    "fio": "fio seq 1 MiB psync buffered",
    "fio_direct": "fio seq 1 MiB psync O_DIRECT",
}


def readers(bench_read, tree, shards, fio):
    """(name, measure) of every read row, in table order; measure() returns (seconds, bytes,
    samples or None). The last, fio O_DIRECT, bypasses the page cache and runs cold only; the fio
    rows only when `fio` (it is installed)."""
    startup = cat_startup()
    rows = [
        (READ_ROWS["shards"], lambda: read_shards(bench_read, shards)),
        (READ_ROWS["files"], lambda: read_files(bench_read, tree)),
        (READ_ROWS["python"], lambda: read_files_python(tree)),
        (READ_ROWS["cat"], lambda: read_cat(shards, startup)),
    ]
    if fio:
        rows += [(READ_ROWS["fio"], lambda: read_fio(shards, direct=False)),
                 (READ_ROWS["fio_direct"], lambda: read_fio(shards, direct=True))]
    return rows


# ---- the run -------------------------------------------------------------------------------------

def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=20000, help="JPEG files in the tree")
    parser.add_argument("--out", default=str(common.DEFAULT_OUT), help="work directory")
    parser.add_argument("--json", help="also write the results to this file")
    common.add_tree_options(parser)
    parser.add_argument("--warm-repeats", type=int, default=5)
    parser.add_argument("--cold-repeats", type=int, default=3)
    parser.add_argument("--judge", action="store_true",
                        help="print the project's goal and PASS/FAIL beside each ratio")
    parser.add_argument("--strict", action="store_true",
                        help="judge, and exit 1 when a goal is missed")
    args = parser.parse_args()
    if args.files < 1:
        parser.error("--files must be at least 1")
    return args


def measure_packing(zerowait, bench_read, tree, tree_size, shards, cache, args):
    """(a) pack vs tar, warm (best of 2) then cold (one run each). Returns the rows and the
    warm pack/tar time ratio. Leaves the shards packed for (b)."""
    tar_path = shards.parent / f"tree-{args.files}.tar"
    log("packing (warm): zerowait pack vs tar, best of 2 each")
    read_files(bench_read, tree)  # so that neither pays for the first read
    pack_warm = tar_warm = float("inf")
    for _ in range(2):
        pack_warm = min(pack_warm, time_pack(zerowait, tree, shards))
        tar_warm = min(tar_warm, time_tar(tree, tar_path))
    log("packing (cold): one run each")
    cache.drop()
    pack_cold = time_pack(zerowait, tree, shards)
    cache.drop()
    tar_cold = time_tar(tree, tar_path)
    tar_path.unlink()
    rows = [common.table_row(name, cache_state, (seconds, tree_size, None), args.files)
            for cache_state, pack_s, tar_s in (("warm", pack_warm, tar_warm),
                                               ("cold", pack_cold, tar_cold))
            for name, seconds in (("zerowait pack --imagefolder (fsync)", pack_s),
                                  ("tar -cf + fsync", tar_s))]
    return rows, pack_warm / tar_warm


def measure_reads(measures, cache, warm_repeats, cold_repeats):
    """(b) every reader once to warm up, then the best of `warm_repeats` warm runs and of
    `cold_repeats` cold ones. Repeats go round-robin over the readers, so a slow spell of this
    shared machine hits every row alike instead of all repeats of one."""
    results = {}
    for name, measure in measures[:-1]:
        log(f"reading (warm-up): {name}")
        measure()
    for repeat in range(warm_repeats):
        for name, measure in measures[:-1]:
            log(f"reading (warm {repeat + 1}/{warm_repeats}): {name}")
            results[(name, "warm")] = common.faster(results.get((name, "warm")), measure())
    for repeat in range(cold_repeats):
        for name, measure in measures:
            log(f"reading (cold {repeat + 1}/{cold_repeats}, {cache.method}): {name}")
            cache.drop()
            results[(name, "cold")] = common.faster(results.get((name, "cold")), measure())
    return [common.table_row(name, cache_state, result)
            for (name, cache_state), result in results.items()]


def judge(rows, pack_over_tar):
    def get(key, cache_state, field):
        return next(r[field] for r in rows
                    if r["name"] == READ_ROWS[key] and r["cache"] == cache_state)

    ratio = common.ratio
    fio = [ratio("cold shards/fio MB/s", get("shards", "cold", "mb_per_s") /
                 get("fio", "cold", "mb_per_s"), 0.85, higher_is_better=True)
           ] if any(r["name"] == READ_ROWS["fio"] for r in rows) else []
    return [
        ratio("pack/tar time (warm)", pack_over_tar, 2.0, higher_is_better=False),
        ratio("warm shards/cat MB/s", get("shards", "warm", "mb_per_s") /
              get("cat", "warm", "mb_per_s"), 0.90, higher_is_better=True),
        *fio,
        ratio("cold shards/per-file C samples/s", get("shards", "cold", "samples_per_s") /
              get("files", "cold", "samples_per_s"), 10.0, higher_is_better=True),
        ratio("cold shards/per-file Python samples/s", get("shards", "cold", "samples_per_s") /
              get("python", "cold", "samples_per_s"), 10.0, higher_is_better=True),
    ]


def main():
    args = parse_args()
    zerowait = common.find_zerowait()
    bench_read = common.find_binary("ZEROWAIT_BENCH_READ", ["build/zw_bench_read"],
                                    "zw_bench_read")
    for tool in ("tar", "cat"):
        if shutil.which(tool) is None:
            sys.exit(f"bench: '{tool}' is not installed")
    fio = shutil.which("fio") is not None
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    tree = common.generate_tree(zerowait, out, args)
    tree_size = common.total_bytes(common.regular_files(tree))
    shards = out / f"shards-{args.files}"
    cache = common.Cache(lambda: common.regular_files(tree) + common.shard_paths(shards))
    rows, pack_over_tar = measure_packing(zerowait, bench_read, tree, tree_size, shards,
                                          cache, args)
    rows += measure_reads(readers(bench_read, tree, shards, fio), cache, args.warm_repeats,
                          args.cold_repeats)
    notes = [cache.note()] if cache.note() else []
    if not fio:
        notes.append("fio is not installed: its rows (the storage's own limit) are left out; "
                     "apt-get install fio adds them")
    notes.append("cat and fio rows move the same bytes as the shards row; samples/s is shown "
                 "only where samples are counted")
    if tree_size < 200 * MB:
        notes.append(f"only {tree_size / MB:.0f} MB: reads of a few milliseconds are mostly "
                     "noise; judge the ratios on the default --files 20000")
    ratios = judge(rows, pack_over_tar)
    print(f"zerowait pack/read benchmark: {args.files} JPEGs, {tree_size / MB:.1f} MB, "
          f"{len(shard_files(shards))} shard(s); cold = {cache.method}")
    common.print_table(rows, ratios, notes, judged=args.judge or args.strict)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"files": args.files, "tree_bytes": tree_size, "cold_method": cache.method,
             "rows": rows, "ratios": ratios, "notes": notes}, indent=2) + "\n")
        log(f"results written to {args.json}")
    if args.strict and any(r["result"] != "PASS" for r in ratios):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
