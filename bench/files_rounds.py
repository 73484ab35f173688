"""Checks `zerowait bench files` against zerowait.Loader measured beside it, round after round.

Each round runs `zerowait bench files DIR --dataset SHARDS --json` and, beside it, reads the same
number of samples of SHARDS through zerowait.Loader in this process (the same threads, shuffle
"random", raw bytes, io "auto"), the shards evicted first. The Loader's own ratio is its
samples/s over the bench's per-file rate of that round; the bench should report at least that
speed-up, since its packed side is the same Loader without Python. The two sides swap order every
round, so that neither always follows the other's page-cache and disk state.

    .venv/bin/python bench/files_rounds.py DIR SHARDS --rounds 8

Prints one table row per round, and exits 1 when the median of the bench's speed-ups is below
the median of the Loader's ratios. Not every round: where the packed side runs at the disk's
bandwidth, the bench's packed side and the Loader are the same reader at the same limit, and a
single round's two figures differ by the disk's noise (docs/bench.md). Needs the zerowait
package importable and the `zerowait` command (common.find_zerowait).
"""

import argparse
import json
import statistics
import sys
import time

import common


def loader_cold(shards, samples, threads, seed):
    """Samples/s of zerowait.Loader over `shards`, cold: evicted first, timed from the first
    next() (the Loader's start-up excluded, as the bench excludes it) to `samples` read."""
    import torch  # noqa: F401  (its import, 1-2 s, is start-up: the first batch would pay it)
    import zerowait
    from zerowait import _emulate_workloads as workloads

    paths = [str(path) for path in common.shard_paths(shards)]
    workloads.evict(paths)
    resident = workloads.measure_page_cache(paths)["resident_share"]
    loader = zerowait.Loader(str(shards), threads=threads, seed=seed, shuffle="random")
    read = 0
    start = time.perf_counter()
    for batch in loader:
        read += batch["__index__"].numel()
        if read >= samples:
            break
    seconds = time.perf_counter() - start
    io = loader.stats()["io"]
    loader.close()
    return dict(samples_per_s=read / seconds, resident_before=resident, io=io)


def bench_cold(zerowait, tree, shards, threads, seed):
    """The bench's JSON report, run in its own process."""
    out = common.run([zerowait, "bench", "files", str(tree), "--dataset", str(shards), "--json",
                      "--threads", str(threads), "--seed", str(seed)])
    return json.loads(out)


def percent(share):
    return "?" if share is None else f"{share * 100:.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", help="the tree of small files")
    parser.add_argument("shards", help="the dataset packed from it")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="on every side (bench default)")
    args = parser.parse_args()
    zerowait = common.find_zerowait()

    header = ("round", "first", "files/s", "bench packed/s", "bench x", "Loader/s", "Loader x",
              "res% f/p/L", "ok")
    print(" | ".join(header))
    failed = 0
    bench_speedups, loader_ratios = [], []
    for r in range(args.rounds):
        seed = r + 1
        report = loader = None
        # Odd rounds start with the bench, even ones with the Loader.
        first = "bench" if r % 2 == 0 else "Loader"
        for side in ((0, 1) if first == "bench" else (1, 0)):
            if side == 0:
                report = bench_cold(zerowait, args.tree, args.shards, args.threads, seed)
            else:
                loader = loader_cold(args.shards, report_samples(args.tree, report),
                                     args.threads, seed)
        files = report["files"]["cold"]
        packed = report["packed"]["cold"]
        loader_ratio = loader["samples_per_s"] / files["items_per_s"]
        ok = report["packed"]["speedup_cold"] >= loader_ratio
        failed += not ok
        bench_speedups.append(report["packed"]["speedup_cold"])
        loader_ratios.append(loader_ratio)
        print(" | ".join([
            str(r + 1), first, f"{files['items_per_s']:.0f}", f"{packed['items_per_s']:.0f}",
            f"{report['packed']['speedup_cold']:.2f}", f"{loader['samples_per_s']:.0f}",
            f"{loader_ratio:.2f}",
            "/".join(percent(s) for s in (files["resident_before"], packed["resident_before"],
                                          loader["resident_before"])),
            "yes" if ok else "NO"]), flush=True)
    bench_median, loader_median = (statistics.median(v) for v in (bench_speedups, loader_ratios))
    print(f"io: bench {report['packed']['io']}, Loader {loader['io']}; threads {args.threads} "
          f"on every side; {args.rounds - failed} of {args.rounds} rounds with the bench's "
          f"cold speed-up >= the Loader's ratio; medians: bench {bench_median:.2f}x, "
          f"Loader {loader_median:.2f}x")
    return 0 if bench_median >= loader_median else 1


def report_samples(tree, report):
    """As many samples as the bench reads per pass; before the bench has run, every file."""
    if report is not None:
        return report["files_read"]
    return len(common.regular_files(tree))


if __name__ == "__main__":
    sys.exit(main())
