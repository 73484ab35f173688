"""bench/remote.py's rows (what each one reads, in which venv) and its table: cold and warm
samples/s per row and latency, ratios against the local reference, the goals judged.
"""

import json
import os
import time
from pathlib import Path

import common
from common import MB
from remote_rows import log

# --rows names: (label in the table, venv or "zerowait", remote_rows task, format it reads).
ROWS = {
    "zerowait": ("zerowait s3:// + cache_dir", "zerowait", "zerowait", "zw"),
    "zerowait-tar": ("zerowait s3:// WebDataset tars + cache_dir", "zerowait", "zerowait_tars",
                     "wds"),
    "litdata": ("LitData StreamingDataset s3://", "peers", "litdata", "litdata"),
    "mds": ("MosaicML Streaming (MDS) s3://", "streaming", "mds", "mds"),
    "webdataset": ("WebDataset http (curl) + cache_dir", "peers", "webdataset", "wds"),
    "s3torchconnector": ("s3torchconnector S3IterableDataset", "peers", "s3torchconnector",
                         "wds"),
}
LOCAL = ("zerowait local shards (reference)", "zerowait", "local", "zw")
GET_LIMIT = ("S3 GET limit: curl, all shards at once",)
GET_FILES_LIMIT = ("S3 GET limit: the same into new files",)
# The cache's default block (BlockCacheOptions::block_bytes): the first-batch goal allows one.
CACHE_BLOCK_BYTES = 4 << 20
FIRST_BATCH_ROUND_TRIPS = 4
ZEROWAIT_ROWS = ["zerowait", "zerowait-tar"]
PEERS = [name for name in ROWS if name not in ZEROWAIT_ROWS]


# ---- the table -----------------------------------------------------------------------------------

def epoch_row(epoch):
    if not epoch or not epoch.get("seconds"):
        return None
    n = epoch.get("epochs", 1)
    return dict(epoch, epochs=n, seconds_per_epoch=epoch["seconds"] / n,
                samples_per_s=epoch["samples"] / epoch["seconds"],
                mb_per_s=epoch["bytes"] / epoch["seconds"] / MB)


def cold_warm(result):
    """(cold epoch, warm epochs) of a row's result, as table rows (None where missing): the
    warm figure is every warm epoch together (their samples, bytes and seconds added up)."""
    epochs = (result or {}).get("epochs") or []
    warm = None
    if len(epochs) > 1:
        warm = {key: sum(e[key] for e in epochs[1:])
                for key in ("seconds", "samples", "bytes", "batches")}
        warm["epochs"] = len(epochs) - 1
    return epoch_row(epochs[0] if epochs else None), epoch_row(warm)


def table_lines(bench):
    """One line per (latency, row, epoch kind), with its ratios to the local reference and to
    zerowait at the same latency."""
    lines = []
    for latency in bench.args.latencies:
        _, local = cold_warm(bench.results.get((latency, "local")))
        zw = dict(zip(("cold", "warm"), cold_warm(bench.results.get((latency, "zerowait")))))
        for row in ["local", "get", "get-files", *bench.rows]:
            label = {"local": LOCAL[0], "get": GET_LIMIT[0],
                     "get-files": GET_FILES_LIMIT[0]}.get(row) or ROWS[row][0]
            base = {"latency_ms": latency, "row": row, "name": label}
            if row in bench.skipped:
                lines.append(dict(base, kind="-", skipped=bench.skipped[row]))
                continue
            result = bench.results.get((latency, row)) or {"error": "not run"}
            if "error" in result:
                lines.append(dict(base, kind="-", skipped=f"failed: {result['error']}"))
                continue
            cold, warm = cold_warm(result)
            kinds = {"local": [("warm", warm)], "get": [("get", cold)],
                     "get-files": [("get", cold)]}.get(
                row, [("cold", cold), ("warm", warm)])
            for kind, epoch in kinds:
                if epoch is None:
                    continue
                line = dict(base, kind=kind, **epoch)
                if local:
                    line["vs_local"] = epoch["samples_per_s"] / local["samples_per_s"]
                if row in PEERS and zw.get(kind):
                    line["zerowait_vs"] = zw[kind]["samples_per_s"] / epoch["samples_per_s"]
                lines.append(line)
    return lines


def fastest_line(find, latency, kind, rows):
    """The table line of the fastest of `rows` at `latency` for `kind` of epoch, or None."""
    lines = [find[(latency, row, kind)] for row in rows if (latency, row, kind) in find]
    return max(lines, key=lambda l: l["samples_per_s"], default=None)


def judge(bench, lines):
    """The goals, per latency: zerowait warm / local, zerowait cold / local (judged at 50 ms),
    zerowait cold / the GET limit into new files (the /dev/null one as information), the first
    batch (judged at 50 ms), zerowait / the fastest peer, cold and warm."""
    from loader_report import ratio  # the benchmarks' PASS/FAIL/SKIP/info ratio
    find = {(l["latency_ms"], l["row"], l["kind"]): l for l in lines if "seconds" in l}
    ratios = []
    for latency in bench.args.latencies:
        for kind, goal in (("warm", 0.90), ("cold", 0.50 if latency == 50 else None)):
            line = find.get((latency, "zerowait", kind))
            ratios.append(ratio(f"zerowait {kind} / local, {latency} ms",
                                line.get("vs_local") if line else None, goal, True))
        cold = find.get((latency, "zerowait", "cold"))
        for row, what, goal in (("get-files", "into files", 0.80),
                                ("get", "to /dev/null", None)):
            limit = find.get((latency, row, "get"))
            ratios.append(ratio(f"zerowait cold / GET limit {what}, {latency} ms",
                                cold["samples_per_s"] / limit["samples_per_s"]
                                if cold and limit else None, goal, True))
        ratios.append(first_batch_ratio(bench, find, latency))
        for kind in ("cold", "warm"):
            fastest = fastest_line(find, latency, kind, [p for p in bench.rows if p in PEERS])
            value = fastest.get("zerowait_vs") if fastest else None
            note = f"fastest peer: {fastest['name']}" if fastest else "no peer measured"
            if fastest and fastest["row"] == "s3torchconnector" and kind == "warm":
                note += " (no cache: reads S3 again)"
            ratios.append(ratio(f"zerowait / fastest peer, {kind}, {latency} ms", value, 1, True,
                                note))
        for kind in ("cold", "warm"):
            tars = find.get((latency, "zerowait-tar", kind))
            fastest = fastest_line(find, latency, kind, ["webdataset", "s3torchconnector"])
            ratios.append(ratio(f"zerowait tars / fastest peer on them, {kind}, {latency} ms",
                                tars["samples_per_s"] / fastest["samples_per_s"]
                                if tars and fastest else None, None, True,
                                f"{fastest['name']}" if fastest else "no peer measured"))
    return ratios


def first_batch_ratio(bench, find, latency):
    """zerowait's first batch, from before Loader() to the first batch in hand, in seconds;
    judged at 50 ms against FIRST_BATCH_ROUND_TRIPS round trips (manifest, shard indexes, the
    batch's blocks, one spare) plus one cache block at the /dev/null GET limit."""
    from loader_report import ratio
    result = bench.results.get((latency, "zerowait")) or {}
    first = (result.get("epochs") or [{}])[0].get("first_batch_s")
    limit = find.get((latency, "get", "get"))
    goal = note = None
    if limit:
        transfer = CACHE_BLOCK_BYTES / (limit["mb_per_s"] * MB)
        goal = FIRST_BATCH_ROUND_TRIPS * latency / 1000 + transfer
        note = (f"{FIRST_BATCH_ROUND_TRIPS} x {latency} ms + {CACHE_BLOCK_BYTES >> 20} MiB at "
                f"{limit['mb_per_s']:,.0f} MB/s = {goal:.3f} s")
    return ratio(f"zerowait first batch, seconds, {latency} ms", first,
                 round(goal, 3) if goal is not None and latency == 50 else None, False, note)


def notes_for(bench, lines):
    args = bench.args
    notes = [f"cold = the first epoch from an empty cache, timed from before the dataset object "
             f"is made; warm = the next epochs together (at least {args.warm_epochs}, and until "
             f"{args.warm_seconds:g} s of them); local = zerowait over the same shards on local "
             "disk (page cache warm), its epochs after a warm-up epoch, counted the same way",
             "GET limit = one GET per zerowait shard, all at once, through the proxy (curl): "
             "to /dev/null, what the server and proxy deliver on this machine (information); "
             "into new files on the caches' file system, what a cache that keeps every byte "
             "can get at best: the cold goal's reference",
             "s3torchconnector has no local cache: its warm epochs read S3 again"]
    for (latency, row), result in bench.results.items():
        short = sorted({e["samples"] for e in result.get("epochs", [])} - {args.samples})
        if short and row not in ("get", "get-files"):
            name = {"local": LOCAL[0]}.get(row) or ROWS[row][0]
            notes.append(f"{name} at {latency} ms: epochs of {', '.join(map(str, short))} "
                         f"samples, not {args.samples}")
    return notes


def zerowait_lines(bench):
    """Below the table: where zerowait's cold epochs went, and its cache's counters."""
    out = []
    for latency, row in ((l, r) for l in bench.args.latencies for r in ZEROWAIT_ROWS):
        r = bench.results.get((latency, row)) or {}
        if not r.get("epochs"):
            continue
        cold = r["epochs"][0]
        cache = r.get("cache") or {}
        out.append(f"{row} at {latency} ms: cold epoch {cold['seconds']:.2f} s = Loader() "
                   f"{r['open_s']:.2f} s (manifest, shard indexes; tar scans) + first batch "
                   f"{cold['first_batch_s'] - r['open_s']:.2f} s + the rest; consumer waited "
                   f"{r['wait_s']:.2f} s in all epochs; cache " + ", ".join(
                       f"{k}={v}" for k, v in cache.items()
                       if k in ("hits", "misses", "waits", "prefetched", "bytes_downloaded")))
    return out


def print_table(header, lines, ratios, notes, extras=()):
    print()
    for text in header:
        print(text)
    print()
    print(f"{'latency':>7}  {'row':<38} {'epoch':<5} {'n':>3} {'s/epoch':>8} {'samples/s':>10} "
          f"{'MB/s':>8} {'/ local':>8} {'zw x':>6}")
    print("-" * 103)
    previous = None
    for l in lines:
        latency = f"{l['latency_ms']} ms" if l["latency_ms"] != previous else ""
        previous = l["latency_ms"]
        if "skipped" in l:
            print(f"{latency:>7}  {l['name']:<38} {'-':<5} skipped: {l['skipped']}")
            continue
        vs_local = f"{l['vs_local']:.2f}" if "vs_local" in l else "-"
        zw = f"{l['zerowait_vs']:.2f}" if "zerowait_vs" in l else ""
        print(f"{latency:>7}  {l['name']:<38} {l['kind']:<5} {l['epochs']:>3} "
              f"{l['seconds_per_epoch']:>8.2f} {l['samples_per_s']:>10,.0f} {l['mb_per_s']:>8,.1f} "
              f"{vs_local:>8} {zw:>6}")
    common.print_ratios(ratios, notes, extras, name_width=44)


def report(bench):
    args = bench.args
    lines = table_lines(bench)
    ratios = judge(bench, lines)
    notes = notes_for(bench, lines)
    zw_shards = len(common.shard_paths(bench.data.zw_dir))
    header = [
        f"zerowait remote-data benchmark: {args.samples} samples of {args.min_bytes:,}-"
        f"{args.max_bytes:,} random bytes + a label ({bench.payload / MB:,.0f} MB), shards of "
        f"{args.shard_mb} MB ({zw_shards} zerowait shards); batch_size {args.batch_size}, "
        f"{args.workers} workers per row; zerowait window {args.window_mb or 256} MB; Ceph RGW on 127.0.0.1 behind zw_fault_proxy "
        f"(+latency per request); {os.cpu_count()} CPUs; {time.perf_counter() - bench.started:.0f}"
        " s in all",
        "goals: zerowait warm epoch >= 0.90 x local; zerowait cold epoch at 50 ms >= 0.50 x local;"
        " zerowait cold >= 0.80 x the GET limit into new files; first batch at 50 ms within "
        f"{FIRST_BATCH_ROUND_TRIPS} round trips + one cache block at the GET limit; zerowait "
        "faster than every peer, cold and warm",
        "columns: n = epochs timed; s/epoch = seconds per epoch; / local = samples/s over "
        "zerowait's local samples/s at the same latency; zw x = zerowait's samples/s of the same "
        "epoch kind over the row's"]
    print_table(header, lines, ratios, notes, zerowait_lines(bench))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"samples": args.samples, "payload_bytes": bench.payload,
             "params": bench.data.params, "batch_size": args.batch_size,
             "workers": args.workers, "window_mb": args.window_mb, "latencies_ms": args.latencies, "lines": lines,
             "ratios": ratios, "notes": notes, "skipped": bench.skipped,
             "results": [{"latency_ms": k[0], "row": k[1], **v}
                         for k, v in bench.results.items()]}, indent=2, default=str) + "\n")
        log(f"results written to {args.json}")
    failed = any(r["result"] == "FAIL" for r in ratios) or any(
        "skipped" in l for l in lines if l["row"] in ("local", "zerowait"))
    return 1 if args.strict and failed else 0
