"""What the pack/read, loader and checkpoint benchmarks share: finding and running the tools,
the synthetic tree, emptying the page cache, fio, keeping the best of repeats, and the table.

Imported as `common` by the scripts beside it (Python puts a script's own folder first on
sys.path). Standard library only: the loader benchmark's parent process runs in any python3.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "out"  # ignored by git
MB = 1e6

FADVISE_NOTE = ("cold = files evicted with posix_fadvise(DONTNEED): drop_caches was not "
                "permitted; inode/dentry caches stayed warm (flatters per-file reads)")


def log(message, tag="bench"):
    print(f"[{tag}] {message}", file=sys.stderr, flush=True)


# ---- tools ---------------------------------------------------------------------------------------

def find_binary(env_var, candidates, what):
    """The binary named by $env_var, else the first of `candidates` (relative to the repo)."""
    if os.environ.get(env_var):
        path = Path(os.environ[env_var])
        if not (path.is_file() and os.access(path, os.X_OK)):
            sys.exit(f"bench: ${env_var}={path} is not an executable file")
        return str(path)
    for candidate in candidates:
        path = REPO / candidate
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    sys.exit(f"bench: no {what} found: set ${env_var} or build it "
             f"(looked for {', '.join(candidates)} under {REPO})")


def find_zerowait():
    """The `zerowait` command: $ZEROWAIT, else .venv/bin/zerowait, else build/zerowait."""
    return find_binary("ZEROWAIT", [".venv/bin/zerowait", "build/zerowait"], "zerowait CLI")


def run(cmd, stdout=subprocess.PIPE):
    """Runs `cmd`; exits with its stderr when it fails. Returns stdout (or None)."""
    result = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"bench: {' '.join(map(str, cmd))} failed with exit code {result.returncode}:\n"
                 f"{result.stderr.strip()}")
    return result.stdout


def parse_json_output(text, what):
    """The JSON object in `text` (fio may print warnings before it)."""
    start = text.find("{")
    if start < 0:
        sys.exit(f"bench: no JSON in the output of {what}:\n{text[:2000]}")
    return json.loads(text[start:])


def run_fio(args):
    """Runs one fio job with `args`; returns its JSON job record, exits when fio reports an
    error."""
    job = parse_json_output(run(["fio", *args, "--output-format=json"]), "fio")["jobs"][0]
    if job.get("error"):
        sys.exit(f"bench: fio reported error {job['error']}")
    return job


def fio_seq_read(paths, direct):
    """One job, psync, sequential 1 MiB reads of `paths` one after the other, buffered or
    O_DIRECT; invalidate=0, so fio leaves the page cache as the caller left it. Returns (seconds
    of fio's own runtime, which leaves out its set-up; bytes read)."""
    if any(":" in p for p in paths):
        sys.exit("bench: fio takes ':' as a file separator; use an --out path without ':'")
    job = run_fio(["--name=seq", "--rw=read", "--bs=1M", "--ioengine=psync",
                   f"--direct={1 if direct else 0}", "--invalidate=0", "--readonly",
                   "--file_service_type=sequential", "--filename=" + ":".join(paths)])
    return max(job["read"]["runtime"], 1) / 1000.0, job["read"]["io_bytes"]


# ---- files and the page cache --------------------------------------------------------------------

def regular_files(root):
    return sorted(str(p) for p in Path(root).rglob("*") if p.is_file())


def shard_paths(shards):
    """The .zws files of a dataset folder, sorted; empty when there are none (yet)."""
    return sorted(str(p) for p in Path(shards).glob("*.zws"))


def total_bytes(paths):
    return sum(os.path.getsize(p) for p in paths)


def drop_page_cache(method, paths=()):
    """Empties the page cache ("drop_caches"), or evicts `paths` ("fadvise") where that is
    refused. The loader benchmark's rows call it in their own processes."""
    os.sync()
    if method == "drop_caches":
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return
    from zerowait import _core  # the one eviction of zerowait's tools

    _core.evict_from_page_cache([str(path) for path in paths])


class Cache:
    """Drops the page cache before cold runs: drop_caches when permitted, else fadvise of the
    files `paths_fn()` names at the time."""

    def __init__(self, paths_fn):
        self.paths_fn = paths_fn
        try:
            drop_page_cache("drop_caches")
            self.method = "drop_caches"
        except OSError as error:
            log(f"cannot drop caches ({error}); evicting files with posix_fadvise(DONTNEED)")
            self.method = "fadvise"

    def drop(self):
        drop_page_cache(self.method, self.paths_fn() if self.method == "fadvise" else ())

    def note(self):
        """The caveat the table must state when cold runs could only evict files, else None."""
        return None if self.method == "drop_caches" else FADVISE_NOTE


# ---- the synthetic tree --------------------------------------------------------------------------

def add_tree_options(parser):
    """The options that shape the tree, beside --files (which each benchmark documents)."""
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--min-bytes", type=int, default=10_000)
    parser.add_argument("--max-bytes", type=int, default=60_000)


def tree_params(args):
    """What the tree (and the shards packed from it) depend on: their reuse stamp."""
    return {"files": args.files, "classes": args.classes, "seed": args.seed,
            "min_bytes": args.min_bytes, "max_bytes": args.max_bytes}


def stamp_matches(folder, stamp, params):
    """Whether `folder` was made from `params`, as its stamp file records."""
    return folder.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == params


def generate_tree(zerowait, out, args):
    """A synthetic tree, reused when one with the same parameters exists (generation is
    deterministic, so reuse gives the same bytes)."""
    params = tree_params(args)
    tree = out / f"tree-{args.files}"
    stamp = out / f"tree-{args.files}.params.json"
    if stamp_matches(tree, stamp, params):
        log(f"reusing {tree}")
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    log(f"generating {args.files} JPEGs under {tree}")
    run([zerowait, "generate", "imagefolder", str(tree), "--files", str(args.files),
         "--classes", str(args.classes), "--seed", str(args.seed),
         "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes)])
    stamp.write_text(json.dumps(params))
    return tree


# ---- results and the table -----------------------------------------------------------------------

def faster(old, new, seconds=lambda result: result[0]):
    """Best of repeats: the faster of two results (`old` may be None; a tie keeps `old`)."""
    return new if old is None or seconds(new) < seconds(old) else old


def table_row(name, cache, result, samples=None):
    """A row of print_table from `result` = (seconds, bytes, samples counted or None)."""
    seconds, nbytes, counted = result
    samples = counted if counted is not None else samples
    return {"name": name, "cache": cache, "seconds": seconds, "bytes": nbytes,
            "mb_per_s": nbytes / seconds / MB,
            "samples_per_s": samples / seconds if samples is not None else None}


def ratio(name, value, goal, higher_is_better, goal_format=""):
    """A judged ratio: PASS when `value` is on the right side of `goal`, else FAIL."""
    passed = value >= goal if higher_is_better else value <= goal
    return {"name": name, "value": value,
            "goal": f"{'>=' if higher_is_better else '<='} {goal:{goal_format}}",
            "result": "PASS" if passed else "FAIL"}


def print_table(rows, ratios, notes, judged=True):
    """The rows, then the ratios: with their goals and PASS/FAIL when `judged`, else their values
    alone (the goals are the project's own, not a verdict on the user's machine)."""
    print()
    print(f"{'measurement':<44} {'cache':<6} {'seconds':>9} {'MB/s':>9} {'samples/s':>11}")
    print("-" * 83)
    for r in rows:
        sps = f"{r['samples_per_s']:,.0f}" if r["samples_per_s"] is not None else "-"
        print(f"{r['name']:<44} {r['cache']:<6} {r['seconds']:>9.3f} {r['mb_per_s']:>9.1f} "
              f"{sps:>11}")
    print()
    if judged:
        print(f"{'ratio':<44} {'value':>9} {'goal':>9} {'result':>8}")
        print("-" * 73)
    else:
        print(f"{'ratio':<44} {'value':>9}")
        print("-" * 54)
    for r in ratios:
        judgement = f" {r['goal']:>9} {r['result']:>8}" if judged else ""
        print(f"{r['name']:<44} {r['value']:>9.2f}{judgement}")
    for note in notes:
        print(f"note: {note}")
    print()


class Results:
    """A benchmark's table as it fills: rows, judged ratios and notes, and `repeat` runs of each
    timed row (the fastest kept)."""

    def __init__(self, repeat):
        self.repeat = repeat
        self.rows, self.ratios, self.notes = [], [], []

    def add_row(self, name, seconds, nbytes, cache_state="-"):
        self.rows.append(table_row(name, cache_state, (seconds, nbytes, None)))

    def judge(self, name, value, goal, higher_is_better):
        self.ratios.append(ratio(name, value, goal, higher_is_better))

    def best(self, fn):
        """Runs fn() `repeat` times; returns the result with the smallest first element."""
        best = None
        for _ in range(self.repeat):
            best = faster(best, fn())
        return best

    def report(self, json_path=None):
        """Prints the table (and writes it to `json_path`); the exit status (report_results)."""
        return report_results(self.rows, self.ratios, self.notes, json_path)


def report_results(rows, ratios, notes, json_path=None):
    """Prints the table, writes rows, ratios and notes to `json_path` if given, and returns the
    exit status: 0 when every ratio met its goal, else 1."""
    print_table(rows, ratios, notes)
    if json_path:
        Path(json_path).write_text(json.dumps(
            {"rows": rows, "ratios": ratios, "notes": notes}, indent=2))
    return 0 if all(r["result"] == "PASS" for r in ratios) else 1


def print_ratios(ratios, notes, extras=(), name_width=58):
    """What the loader and remote benchmarks print under their tables: explanatory lines, the
    ratios with their goals and PASS/FAIL, and notes."""
    if extras:
        print()
        for line in extras:
            print(line)
    print()
    print(f"{'ratio':<{name_width}} {'value':>9} {'goal':>9} {'result':>7}")
    print("-" * (name_width + 28))
    for r in ratios:
        value = "-" if r["value"] is None else f"{r['value']:,.2f}"
        suffix = f"  ({r['note']})" if r.get("note") else ""
        print(f"{r['name']:<{name_width}} {value:>9} {r['goal']:>9} {r['result']:>7}{suffix}")
    for note in notes:
        print(f"note: {note}")
    print()


# ---- epochs of an iterator, for the Python-only benchmarks (tokens.py, image_formats.py) ------

def timed_epochs(epoch, seconds):
    """Runs epoch() once to warm up (page cache, workers, arenas), then until `seconds` of epochs
    are timed (at least 2); epoch() returns what it delivered (samples, tokens). Returns (that
    count per second, epochs timed)."""
    import time
    epoch()
    delivered, spent, epochs = 0, 0.0, 0
    while epochs < 2 or spent < seconds:
        start = time.perf_counter()
        delivered += epoch()
        spent += time.perf_counter() - start
        epochs += 1
    return delivered / spent, epochs


def add_epoch_options(parser, out_name, seconds):
    """--seconds, --out (bench/out/OUT_NAME, emptied at the start) and --json."""
    parser.add_argument("--seconds", type=float, default=seconds,
                        help="time epochs until at least this many seconds are timed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / out_name,
                        help="work folder, emptied first")
    parser.add_argument("--json", type=Path, help="also write the results here")


def empty_folder(path):
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def import_torchvision():
    """torchvision, or None. PyPI's torchvision wheels are CUDA builds; beside a CPU torch their
    C++ ops fail to load, and torchvision 0.28's import then fails registering fake kernels for
    two of them. The transforms are pure Python and need none of those ops, so the two schemas
    are declared (never implemented, never called) and the import retried."""
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            return None
    except ImportError:
        return None
    import sys
    import torch

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    schemas = torch.library.Library("torchvision", "DEF")  # noqa: kept alive in the module
    schemas.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    schemas.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARIES.append(schemas)
    import torchvision
    return torchvision


_LIBRARIES = []  # torch.library.Library objects must outlive the import
