"""``zerowait emulate WORKLOAD``: does this storage keep N accelerators busy? MLPerf Storage's
method, with zerowait's loader beside PyTorch's DataLoader over plain files.

Run as ``python -m zerowait.emulate WORKLOAD [options]`` (the ``zerowait emulate`` command
execs exactly that). The accelerator is replaced by a sleep of the workload's compute time per
batch; N rank processes each read their partition of a data set through ``--input`` (zerowait:
zerowait.Loader with rank/world; files: torch DataLoader over the plain files with
``--workers`` worker processes and a DistributedSampler). The accelerator utilisation (AU) is
DLIO's (see _emulate_train.py): per rank, compute / wall over every step but the first; the
run's AU is the ranks' mean, and it passes when it reaches the workload's floor.

- ``--generate DIR`` writes the (scaled) data set twice, ``DIR/zerowait`` and ``DIR/files``;
  ``--data DIR`` runs on it. Before each run its files are dropped from the page cache
  (posix_fadvise DONTNEED) unless ``--warm``: MLPerf requires a data set of 5x the host's
  memory so that it cannot be served from the cache; a scaled one could be, so it is evicted.
  What the cache held of the files when each run began is measured (mincore) and labels the
  run: evicted (at most 1 % resident), partial, or warm (at least 99 %), with the share; on
  tmpfs, whose pages are the files, an "evicted" run is warm and says so.
- ``--scale F`` shrinks the sample sizes, the sample count and the compute per batch by F: each
  emulated accelerator still asks for the bytes per second of the full workload, over a data
  set F**2 of the size. Per-sample and per-file costs do not shrink, so at a small F a
  small-sample workload asks for more samples per second than the full one: a pessimistic test.
- ``--find-max``: the largest N that meets the floor (doubling from 1 until N fails, then
  bisecting), bounded by ``--max-accelerators`` and by the data set (each rank needs 2 steps).
  One run's verdict is noise near the floor, so each N is run twice; when the two disagree, a
  third run decides (the majority of three): FIND_MAX_RULE.
- ``--input both``: the exit status judges zerowait's row; the DataLoader row is the reference,
  and its missing the floor is information.
- llama3-8b / llama3-70b: checkpointing (see _emulate_checkpoint.py); ``--data DIR`` is where
  the checkpoints go, ``--accelerators`` the ranks (default: MLPerf's 8 / 64).

``--out RUN`` writes the run directory of docs/observe.md (kind "emulate"); ``--json`` prints
its run.json. Exit status: 0 when every run meets its floor; 3 when one does not (with
``--find-max``: when not even 1 accelerator does; with ``--input both``: zerowait's runs only);
1 on an error; 2 on a bad command line (``--data`` or ``--generate`` naming a file, too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Dict, List, Optional

from zerowait import _core, _emulate_checkpoint, _emulate_train
from zerowait import _emulate_workloads as workloads

SCHEMA = _core.RUN_SCHEMA  # "zerowait.run/1" (docs/observe.md)
RULE = "compute / wall over all steps but the first, mean over ranks (MLPerf Storage)"
EXIT_FAILED_FLOOR = 3
FIND_MAX_RULE = ("each N runs twice; when the two verdicts differ, a third run decides "
                 "(the majority of three)")


class UsageError(ValueError):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zerowait emulate",
        description="Whether storage keeps N accelerators busy, by MLPerf Storage's rules.")
    p.add_argument("workload", choices=workloads.WORKLOADS)
    p.add_argument("--accelerator", choices=workloads.ACCELERATORS, default="h100",
                   help="whose compute time per batch to emulate")
    p.add_argument("--accelerators", type=int, default=None,
                   help="rank processes (default: 1; checkpointing: MLPerf's ranks)")
    p.add_argument("--scale", type=float, default=None,
                   help="shrink sample sizes, counts and compute (default: 1, or --data's)")
    p.add_argument("--generate", metavar="DIR", help="write the data set into DIR")
    p.add_argument("--data", metavar="DIR", help="run on the data set in DIR")
    p.add_argument("--input", choices=("zerowait", "files", "both"), default="zerowait")
    p.add_argument("--shuffle", choices=("random", "block"), default="random",
                   help="zerowait input's order: a uniform permutation (as DistributedSampler)"
                        " or blocks read whole, shuffled within a window")
    p.add_argument("--workers", type=int, default=None,
                   help="loader threads / DataLoader workers per rank (default: MLPerf's "
                        "read_threads)")
    p.add_argument("--samples", type=int, default=None, help="--generate this many samples")
    p.add_argument("--steps", type=int, default=0, help="at most this many steps per rank")
    p.add_argument("--compute", type=float, default=None,
                   help="seconds of compute per batch, instead of the scaled preset's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm", action="store_true", help="do not evict the page cache first")
    p.add_argument("--find-max", action="store_true",
                   help="the most accelerators that meet the floor; " + FIND_MAX_RULE)
    p.add_argument("--max-accelerators", type=int, default=64)
    p.add_argument("--checkpoints", type=int, default=2,
                   help="checkpointing: checkpoints written and read")
    p.add_argument("--out", metavar="RUN", help="write the run directory")
    p.add_argument("--json", action="store_true", help="print run.json on stdout")
    return p


def check_args(args: argparse.Namespace) -> None:
    """The same checks as the C++ command's, for runs of the module itself."""
    if args.scale is not None and not 0 < args.scale <= 1:
        raise UsageError(f"--scale must be > 0 and <= 1, got {args.scale:g}")
    for name in ("accelerators", "workers", "samples", "max_accelerators", "checkpoints"):
        value = getattr(args, name)
        least = 0 if name == "workers" else 1
        if value is not None and value < least:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    if args.compute is not None and args.compute < 0:
        raise UsageError(f"--compute must be >= 0, got {args.compute:g}")
    for name in ("data", "generate"):
        path = getattr(args, name)
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"--{name} {path} is a file; give a directory (--generate makes "
                             "it, --data runs on what --generate made)")
    if args.workload in workloads.CHECKPOINTING:
        if not args.data:
            raise UsageError(f"{args.workload} writes checkpoints into --data DIR; give one")
    elif not args.data and not args.generate:
        raise UsageError("give --data DIR to run on a data set that --generate made, or "
                         "--generate DIR to make one")


class Output:
    """Human lines on stdout, or on stderr when stdout carries the JSON."""

    def __init__(self, json_mode: bool) -> None:
        self.stream = sys.stderr if json_mode else sys.stdout

    def __call__(self, line: str = "") -> None:
        print(line, file=self.stream, flush=True)


# --- training ------------------------------------------------------------------------------


def _row(input_name: str, n: int, result: Dict, floor: float) -> Dict:
    return dict(input=input_name, accelerators=n, au=round(result["au"], 4), floor=floor,
                ranks_au=[round(r["au"], 4) for r in result["ranks"]],
                **{"pass": result["au"] >= floor},
                samples_per_s=round(result["samples_per_s"], 1),
                mb_per_s=round(result["mb_per_s"], 1), steps=result["counted_steps"],
                duration_s=round(result["duration_s"], 2),
                page_cache=result["page_cache"]["text"],
                resident_share=result["page_cache"]["resident_share"])


TABLE = "{:<9} {:>12} {:>7} {:>6} {:>5} {:>11} {:>9}  {:<26} {}"


def _table_line(row: Dict) -> str:
    ranks = row["ranks_au"]
    per_rank = (" ".join(f"{a:.1%}" for a in ranks) if len(ranks) <= 4
                else f"{min(ranks):.1%} .. {max(ranks):.1%}")
    return TABLE.format(row["input"], row["accelerators"], f"{row['au']:.1%}",
                        f"{row['floor']:.0%}", "yes" if row["pass"] else "NO",
                        f"{row['samples_per_s']:,.1f}", f"{row['mb_per_s']:,.1f}",
                        row["page_cache"], per_rank)


def run_training(args: argparse.Namespace, out: Output) -> int:
    preset = workloads.TRAINING[args.workload]
    if args.generate:
        data = workloads.scaled_training(preset, args.scale or 1.0, args.samples)
        out(f"generating {args.workload} at scale {data['scale']:g} into {args.generate}: "
            f"{data['samples']:,} samples of {data['sample_bytes']:,} bytes"
            + (f" ± {data['sample_stdev']:,}" if data["sample_stdev"] else "")
            + f", {data['files']:,} files, twice (zerowait shards and plain files)")
        started = time.monotonic()
        made = workloads.generate(args.generate, data, args.seed, out)
        out(f"generated {workloads.format_bytes(made['bytes'])} per copy in "
            f"{time.monotonic() - started:.1f} s")
        if not args.data:
            return 0
    metadata = workloads.load_metadata(args.data, args.workload)
    scale = metadata["scale"]
    if args.scale is not None and not math.isclose(args.scale, scale):
        raise UsageError(f"{args.data} was generated at --scale {scale:g}; run it with that "
                         f"scale (or generate it again at {args.scale:g})")
    run = workloads.plan(preset, args.accelerator, scale, args.compute)
    workers = args.workers if args.workers is not None else preset.read_threads
    run["workers"] = workers
    inputs = ["zerowait", "files"] if args.input == "both" else [args.input]
    bound = min(args.max_accelerators, metadata["samples"] // (2 * preset.batch))
    sizes = sorted(workloads.sample_sizes(metadata, metadata["seed"]), reverse=True)
    largest_batch_bytes = int(sum(sizes[:preset.batch]))

    out(f"zerowait emulate {args.workload} ({args.accelerator}): MLPerf Storage's method, "
        f"numbers from {run['config']}")
    out(f"scale {scale:g}: MLPerf's number -> this run's")
    for line in workloads.describe_scaling(preset, metadata, run):
        out("  " + line)
    cache_note = ("the page cache is kept (--warm): reads may come from memory" if args.warm
                  else "its files are dropped from the page cache before each run "
                       "(posix_fadvise DONTNEED): MLPerf sizes the data set at 5x the host's "
                       "memory so that it cannot be cached; a scaled data set could be")
    cache_note += ("; what it held when each run began is measured (mincore): the 'page cache' "
                   "column")
    out(f"data set {args.data}: {metadata['samples']:,} samples, "
        f"{workloads.format_bytes(metadata['bytes'])} per copy; {cache_note}")
    out(f"each step: next batch, then sleep {run['compute']:.5g} s; AU = {RULE}")
    out(f"per rank: zerowait.Loader with {workers} threads, shuffle {args.shuffle!r}; torch "
        f"DataLoader with {workers} workers, DistributedSampler (a uniform permutation)")
    out()
    if args.find_max:
        out(f"--find-max: {FIND_MAX_RULE}")
    if args.input == "both":
        out("the exit status judges zerowait's rows; the DataLoader's are the reference")
    out(TABLE.format("input", "accelerators", "AU", "floor", "pass", "samples/s", "MB/s",
                     "page cache", "AU per rank"))

    results: List[Dict] = []

    def trial(input_name: str, n: int) -> Optional[Dict]:
        steps = metadata["samples"] // (preset.batch * n)
        if args.steps:
            steps = min(steps, args.steps)
        if steps < 2:
            raise UsageError(
                f"{n} accelerators need {2 * preset.batch * n:,} samples for 2 steps each (the "
                f"first does not count); {args.data} holds {metadata['samples']:,}: generate "
                f"more (a larger --scale, or --samples)")
        spec = dict(data=args.data, input=input_name, accelerators=n, batch=preset.batch,
                    compute=run["compute"], steps=steps, workers=workers, seed=args.seed,
                    shuffle=args.shuffle,
                    warm=args.warm, samples=metadata["samples"],
                    samples_per_file=metadata["samples_per_file"],
                    sample_bytes=metadata["sample_bytes"],
                    largest_batch_bytes=largest_batch_bytes,
                    sample_stdev=metadata["sample_stdev"])
        result = _emulate_train.run(spec, out)
        row = _row(input_name, n, result, preset.floor)
        results.append(dict(row=row, steps=result["steps"], evicted=result["evicted"]))
        out(_table_line(row))
        return row

    def stable_pass(input_name: str, n: int) -> bool:
        """N's verdict by FIND_MAX_RULE."""
        first, second = trial(input_name, n)["pass"], trial(input_name, n)["pass"]
        return first if first == second else trial(input_name, n)["pass"]

    find_max: Dict[str, int] = {}
    for input_name in inputs:
        if not args.find_max:
            trial(input_name, args.accelerators or 1)
            continue
        if bound < 1:
            raise UsageError(f"{args.data} holds too few samples for 2 steps of one accelerator")
        lo, hi, n = 0, bound + 1, 1
        while n <= bound:  # double while the floor is met
            if not stable_pass(input_name, n):
                hi = n
                break
            lo, n = n, n * 2
        while hi - lo > 1:  # then bisect between the last pass and the first failure
            mid = (lo + hi) // 2
            if stable_pass(input_name, mid):
                lo = mid
            else:
                hi = mid
        find_max[input_name] = lo
        limit = (f"bounded by --max-accelerators {args.max_accelerators}"
                 if bound == args.max_accelerators
                 else f"bounded by the data set: {bound} accelerators get 2 steps each")
        noun = "accelerator meets" if lo == 1 else "accelerators meet"
        out(f"{input_name}: at most {lo} {noun} the {preset.floor:.0%} floor "
            f"({limit})" if lo else
            f"{input_name}: not even 1 accelerator meets the {preset.floor:.0%} floor")

    failed = missed_floor(args.input, [r["row"] for r in results],
                          find_max if args.find_max else None)
    report = training_run_json(args, preset, metadata, run, results, find_max)
    finish(args, report, results, out)
    return EXIT_FAILED_FLOOR if failed else 0


def missed_floor(input_choice: str, rows: List[Dict], find_max: Optional[Dict[str, int]]) -> bool:
    """Whether the run exits 3. With ``--input both`` zerowait's rows are judged: the DataLoader's
    are the reference, and its missing the floor is information. ``find_max`` (input -> N, None
    without --find-max): failed when not even 1 accelerator met the floor."""
    judged = "zerowait" if input_choice == "both" else input_choice
    if find_max is not None:
        return find_max.get(judged) == 0
    return any(not row["pass"] for row in rows if row["input"] == judged)


def training_run_json(args, preset, metadata, run, results, find_max) -> Dict:
    main = results[0]
    row = main["row"]
    counted = [s for s in main["steps"] if s["step"] >= 1]
    causes = ["input", "compute", "other"]
    seconds = {c: sum(s[c] for s in counted) for c in causes}
    wall = sum(s["wall"] for s in counted) or 1.0
    return dict(
        schema=SCHEMA, kind="emulate",
        title=f"{args.workload} on {args.data}, {row['accelerators']} accelerators "
              f"({args.accelerator}), {row['input']} input",
        command=["zerowait", "emulate"] + sys.argv[1:],
        started_unix=STARTED_UNIX, duration_s=round(time.monotonic() - STARTED, 3),
        **_core.cause_summary(seconds, wall, decimals=6),
        au={"value": row["au"], "floor": row["floor"], "pass": row["pass"],
            "steps": row["steps"], "rule": RULE},
        throughput=dict(samples_per_s=row["samples_per_s"], mb_per_s=row["mb_per_s"]),
        cost=None, comparison=None, events=None, doctor=None,
        rows=[r["row"] for r in results],
        emulate=dict(workload=args.workload, accelerator=args.accelerator,
                     scale=metadata["scale"], config=run["config"], batch=preset.batch,
                     compute_s=run["compute"], compute_full_s=run["compute_full"],
                     workers=run["workers"], shuffle=args.shuffle,
                     data=dict(metadata),
                     page_cache=dict(asked="kept (--warm)" if args.warm else "evicted",
                                     measured=row["page_cache"],
                                     resident_share=row["resident_share"]),
                     find_max=find_max or None,
                     find_max_rule=FIND_MAX_RULE if args.find_max else None))


# --- checkpointing -------------------------------------------------------------------------


def run_checkpointing(args: argparse.Namespace, out: Output) -> int:
    preset = workloads.CHECKPOINTING[args.workload]
    scale = args.scale or 1.0
    ranks = args.accelerators or preset.ranks
    total = preset.total_bytes * scale
    out(f"zerowait emulate {args.workload}: MLPerf Storage's checkpointing ({workloads.SOURCE}/"
        f"{preset.config})")
    out(f"  checkpoint  {workloads.format_bytes(preset.total_bytes)} -> "
        f"{workloads.format_bytes(total)} (x {scale:g}), "
        f"{workloads.format_bytes(total / ranks)} per rank")
    out(f"  ranks       {preset.ranks} -> {ranks}"
        + (" (--accelerators)" if args.accelerators else ""))
    out(f"  {args.checkpoints} checkpoints written (fsync) and read back after eviction "
        f"from the page cache, into {args.data}")
    result = _emulate_checkpoint.run(preset, dict(
        dir=args.data, ranks=ranks, scale=scale, checkpoints=args.checkpoints,
        seed=args.seed), out)
    out()
    fmt = "{:<22} {:>11} {:>11}  {}"
    out(fmt.format("method", "write MB/s", "read MB/s", "training blocked per checkpoint"))
    z, t = result["zerowait"], result["torch"]
    out(fmt.format("zerowait.Checkpointer", f"{z['write_mb_per_s']:,.1f}",
                   f"{z['read_mb_per_s']:,.1f}",
                   f"{z['blocking_s']:.3f} s, mean of "
                   + " ".join(f"{b:.3f}" for b in z["blocking_each_s"])
                   + " (save() returns after the snapshot; the first save fills the staging "
                     "pool)"))
    out(fmt.format("torch.save + fsync", f"{t['write_mb_per_s']:,.1f}",
                   f"{t['read_mb_per_s']:,.1f}", f"{t['blocking_s']:.3f} s (the whole write)"))
    saved = t["blocking_s"] - z["blocking_s"]
    out(f"per checkpoint, training waits {saved:.3f} s less with zerowait "
        f"({t['blocking_s'] / z['blocking_s']:.1f}x less)" if z["blocking_s"] > 0 else "")
    steps = result["steps"]
    seconds = {c: sum(s[c] for s in steps) for c in ("checkpoint", "compute")}
    wall = sum(s["wall"] for s in steps) or 1.0
    def rounded(values: Dict) -> Dict:
        return {k: [round(x, 4) for x in v] if isinstance(v, list) else round(v, 4)
                for k, v in values.items()}

    rows = [dict(method="zerowait", ranks=ranks, **rounded(z)),
            dict(method="torch.save+fsync", ranks=ranks, **rounded(t))]
    report = dict(
        schema=SCHEMA, kind="emulate",
        title=f"{args.workload} checkpointing into {args.data}, {ranks} ranks",
        command=["zerowait", "emulate"] + sys.argv[1:], started_unix=STARTED_UNIX,
        duration_s=round(time.monotonic() - STARTED, 3),
        **_core.cause_summary(seconds, wall, decimals=6),
        au=None, throughput=dict(samples_per_s=None, mb_per_s=round(z["write_mb_per_s"], 1)),
        cost=None, comparison=None, events=None, doctor=None, rows=rows,
        emulate=dict(workload=args.workload, scale=scale, ranks=ranks,
                     checkpoint_bytes=result["bytes"], checkpoints=args.checkpoints,
                     config=f"{workloads.SOURCE}/{preset.config}",
                     note="seconds: per save, 'checkpoint' is the time save() blocked and "
                          "'compute' the rest of the write, when training goes on"))
    finish(args, report, [dict(row=None, steps=steps, evicted=None)], out)
    return 0


# --- output --------------------------------------------------------------------------------


def finish(args, report: Dict, results: List[Dict], out: Output) -> None:
    if args.out:
        write_run(args.out, report, results)
        out(f"run directory: {args.out} (zerowait report {args.out})")
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")


def write_run(directory: str, report: Dict, results: List[Dict]) -> None:
    """run.json, steps.jsonl (the first configuration's steps) and steps/INPUT-N.jsonl (every
    configuration's), through the one writer of run directories (_core.write_run)."""
    files = {"steps.jsonl": results[0]["steps"]}
    if len(results) > 1:
        runs: Dict[str, int] = {}
        for r in results:
            base = f"{r['row']['input']}-{r['row']['accelerators']}"
            runs[base] = runs.get(base, 0) + 1  # --find-max runs an N more than once
            name = f"{base}.jsonl" if runs[base] == 1 else f"{base}-run{runs[base]}.jsonl"
            r["row"]["steps_file"] = f"steps/{name}"
            files[f"steps/{name}"] = r["steps"]
        report["rows"] = [r["row"] for r in results]
    _core.write_run(directory, report, files)


STARTED = time.monotonic()
STARTED_UNIX = time.time()


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Output(args.json)
    try:
        check_args(args)
        if args.workload in workloads.CHECKPOINTING:
            return run_checkpointing(args, out)
        return run_training(args, out)
    except UsageError as error:
        parser.print_usage(sys.stderr)
        print(f"zerowait emulate: error: {error}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, OSError) as error:
        print(f"zerowait emulate: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
