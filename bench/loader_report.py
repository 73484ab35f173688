"""The loader benchmark's report (bench/loader.py measures): the table of rows, the ratios judged
against their goals, the notes, and the --json file."""

import json
import os
import time
from pathlib import Path

import common
from common import MB
from loader_rows import REF_WARMUP_BATCHES, log

MIB = 1 << 20

NAMES = {
    "a": "DataLoader, per-file Dataset, raw, 2 workers, list collate",
    "a_flat": "DataLoader, per-file Dataset, raw, 2 workers, flat shm cat",
    "b": "zerowait.Loader raw bytes, shuffle=random",
    "c": "torchvision ImageFolder + RandomResizedCrop(224)+flip, 2 w.",
    "d": "zerowait.Loader decode RandomResizedCrop(224, flip)",
    "e_buffered": "fio seq 1 MiB psync buffered (shard files)",
    "e_direct": "fio seq 1 MiB psync O_DIRECT (shard files)",
    "f": "zerowait.Loader raw, consumer computes 1.5 x t_b per batch",
    "g": "zerowait.Loader raw bytes, shuffle=block, io=direct",
}
# The table's lines: (key, cache), in this order; a key's first letter is its row.
TABLE_ORDER = [("a", "warm"), ("a", "cold"), ("a_flat", "warm"), ("a_flat", "cold"),
               ("b", "warm"), ("b", "cold"), ("c", "warm"),
               ("d", "warm"), ("e_buffered", "cold"), ("e_direct", "cold"), ("f", "warm"),
               ("g", "cold")]


def mib(nbytes):
    return f"{nbytes / MIB:,.0f} MiB"


def ratio(name, value, goal, higher_is_better, note=""):
    """common.ratio, plus SKIP where a row was not measured and "info" where there is no goal;
    goals print as 15 rather than 15.0."""
    if value is None:
        return {"name": name, "value": None, "goal": goal_text(goal, higher_is_better),
                "result": "SKIP", "note": note}
    if goal is None:
        return {"name": name, "value": value, "goal": "-", "result": "info", "note": note}
    return dict(common.ratio(name, value, goal, higher_is_better, goal_format="g"), note=note)


def goal_text(goal, higher_is_better):
    return "-" if goal is None else f"{'>=' if higher_is_better else '<='} {goal:g}"


def print_table(header, rows, extras, ratios, notes):
    print()
    print(header)
    print()
    print(f"{'row':<4} {'measurement':<58} {'cache':<5} {'batches':>9} {'seconds':>8} "
          f"{'MB/s':>8} {'samples/s':>10}")
    print("-" * 107)
    for r in rows:
        if r.get("skipped"):
            print(f"({r['row']}) {r['name']:<58} {r['cache']:<5} skipped: {r['skipped']}")
            continue
        batches = (f"{r['batches']}/{r['epoch_batches']}" if r.get("batches") is not None
                   else "-")
        mbs = f"{r['mb_per_s']:,.1f}" if r.get("mb_per_s") else "-"
        sps = f"{r['samples_per_s']:,.0f}" if r.get("samples_per_s") else "-"
        print(f"({r['row']}) {r['name']:<58} {r['cache']:<5} {batches:>9} {r['seconds']:>8.3f} "
              f"{mbs:>8} {sps:>10}")
    common.print_ratios(ratios, notes, extras)


def table_rows(bench):
    """The measured rows in TABLE_ORDER, and a line for each wanted row that was skipped or
    failed throughout."""
    rows = []
    for key, cache_state in TABLE_ORDER:
        if key[0] not in bench.wanted:
            continue
        if (key, cache_state) in bench.best:
            rows.append(bench.best[(key, cache_state)])
        elif key[0] in bench.skipped or key[0] in bench.failed:
            reason = bench.skipped.get(key[0], "failed (see the error above)")
            rows.append({"row": key[0], "name": NAMES[key], "cache": cache_state,
                         "skipped": reason})
    return rows


def extra_lines(bench):
    """The lines below the rows: (b)'s memory and stats(), (f)'s batch time and waits."""
    extras = []
    if bench.info.get("b"):
        m = bench.info["b"]
        growth = m["peak_rss"] - m["baseline_rss"]
        extras.append(f"(b) memory: RSS after importing torch+zerowait {mib(m['baseline_rss'])}, "
                      f"peak {mib(m['peak_rss'])} (ru_maxrss "
                      f"{mib(m['ru_maxrss']) if m.get('ru_maxrss') else '-'}), growth "
                      f"{mib(growth)}; memory_budget {mib(bench.args.memory_budget)}")
    if "b" in bench.wanted:
        for cache_state in ("warm", "cold"):
            st = bench.get("b", cache_state, "stats")
            if st:
                extras.append(f"(b) {cache_state} epoch stats(): " + ", ".join(
                    f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in st.items()))
    if bench.info.get("f"):
        f = bench.info["f"]
        busy = f["busy"]
        extras.append(f"(f) t_b {f['t_b'] * 1e3:.2f} ms (no-op epoch {f['idle']['seconds']:.2f} s"
                      f" / {f['idle']['batches']} batches); compute "
                      f"{f['compute_per_batch'] * 1e3:.2f} ms/batch; epoch {busy['seconds']:.2f} s,"
                      f" computing {busy['compute_s']:.2f} s; stats wait_s "
                      f"{busy['stats'].get('wait_s', float('nan')):.3f} s")
        w = busy["waits"]
        extras.append(f"(f) waits seen by the consumer: first batch {w['first_s'] * 1e3:.1f} ms, "
                      f"the other {busy['batches'] - 1} batches {w['rest_s'] * 1e3:.1f} ms in all "
                      f"({w['rest_over_1ms']} over 1 ms, longest {w['max_rest_s'] * 1e3:.1f} ms)")
    return extras


def judge(bench):
    """The ratios, judged against their goals (goal None: shown for information)."""
    def div(key, other, field, cache_state):
        x = bench.get(key, cache_state, field)
        y = bench.get(other, cache_state, field)
        return x / y if x is not None and y else None

    memory = bench.info.get("b")
    budget = bench.args.memory_budget
    return [
        ratio("(b)/(a) samples/s, warm", div("b", "a", "samples_per_s", "warm"), 15, True),
        ratio("(b)/(a) samples/s, cold", div("b", "a", "samples_per_s", "cold"), None, True),
        ratio("(b)/(a) samples/s, warm, flat shm collate",
              div("b", "a_flat", "samples_per_s", "warm"), None, True),
        ratio("(b)/(a) samples/s, cold, flat shm collate",
              div("b", "a_flat", "samples_per_s", "cold"), None, True),
        ratio("cold (b)/(e) MB/s, fio buffered", div("b", "e_buffered", "mb_per_s", "cold"),
              0.80, True),
        ratio("cold (b)/(e) MB/s, fio O_DIRECT", div("b", "e_direct", "mb_per_s", "cold"),
              None, True),
        ratio("cold (g)/(e) MB/s, shuffle=block against fio O_DIRECT",
              div("g", "e_direct", "mb_per_s", "cold"), 0.85, True),
        ratio("(d)/(c) samples/s, warm", div("d", "c", "samples_per_s", "warm"), 2, True),
        ratio("(f) utilisation (compute / wall)", bench.get("f", "warm", "utilisation"), 0.97,
              True),
        ratio("(b) peak RSS - baseline - memory_budget, MiB",
              (memory["peak_rss"] - memory["baseline_rss"] - budget) / MIB if memory else None,
              150, False),
        ratio("(b) peak RSS - memory_budget, MiB (incl. torch)",
              (memory["peak_rss"] - budget) / MIB if memory else None, None, False),
    ]


def notes_for(bench):
    args, wanted = bench.args, bench.wanted
    notes = []
    if "a" in wanted or "c" in wanted:
        notes.append(f"(a) and (c) are capped: {REF_WARMUP_BATCHES} warm-up batches (not timed), "
                     f"then {args.ref_batches} timed batches; zerowait rows time full epochs "
                     "after a warm-up epoch")
    if args.repeats > 1:
        notes.append(f"each row ran {args.repeats} times (round-robin); the table keeps the "
                     "fastest run, and the largest RSS growth")
    if "a" in wanted:
        notes.append("(a) list collate is judged (what users write for variable-sized samples); "
                     "the flat shared-memory collate is the cheapest a per-file DataLoader can "
                     "be and is shown for information")
    if bench.cache.note():
        notes.append(bench.cache.note())
    if any(r in wanted for r in "bdf"):
        notes.append("(b) MB/s counts the payload bytes delivered (all raw fields); the shard "
                     f"files fio reads hold {(bench.shard_size / bench.tree_size - 1) * 100:.1f} %"
                     " more (headers, indexes)" if bench.shard_size and bench.tree_size else
                     "(b) MB/s counts the payload bytes delivered")
    if bench.tree_size < 200 * MB:
        notes.append(f"only {bench.tree_size / MB:.0f} MB: judge the ratios on the default "
                     "--files 20000")
    for row in sorted(set(bench.failed)):
        runs = bench.failed.count(row)
        notes.append(f"row ({row}) failed in {runs} of {args.repeats} run(s); the table shows the "
                     "runs that completed, if any; see the messages above")
    return notes


def report(bench):
    """Prints the table, writes --json; returns the exit status."""
    args = bench.args
    rows, ratios, notes = table_rows(bench), judge(bench), notes_for(bench)
    header = (f"zerowait loader benchmark: {args.files} JPEGs, {bench.tree_size / MB:.1f} MB in "
              f"the tree, {len(bench.shard_files)} shard(s) of {bench.shard_size / MB:.1f} MB; "
              f"batch_size {args.batch_size}, memory_budget {mib(args.memory_budget)}; cold = "
              f"{bench.cache.method}; {os.cpu_count()} CPUs; rows run by {bench.python}; "
              f"{time.perf_counter() - bench.started:.0f} s in all")
    print_table(header, rows, extra_lines(bench), ratios, notes)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"files": args.files, "tree_bytes": bench.tree_size,
             "shard_bytes": bench.shard_size, "batch_size": args.batch_size,
             "memory_budget": args.memory_budget, "cold_method": bench.cache.method,
             "rows": rows, "ratios": ratios, "notes": notes, "memory": bench.info.get("b"),
             "emulated_accelerator": bench.info.get("f"), "skipped": bench.skipped,
             "failed": bench.failed}, indent=2) + "\n")
        log(f"results written to {args.json}")
    if args.strict and (bench.failed or any(r["result"] == "FAIL" for r in ratios)):
        return 1
    return 0
