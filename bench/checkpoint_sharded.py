"""Sharded checkpoint benchmark: zerowait.Checkpointer against torch.distributed.checkpoint (DCP),
4 gloo ranks, a DTensor training state, side by side in one run.

The state is --gib (default 2.0) of fp32 DTensors Shard(0) over 4 ranks: 8 weight matrices of
2,048 columns and their biases, with AdamW's two moments (checkpoint_sharded_state.py). The ranks
are processes on this machine (checkpoint_sharded_worker.py); every time is the slowest rank's.

- blocking time of one save (best of --repeat, after a warm-up save each): zerowait's save();
  dcp.async_save with a DefaultStager, thread-based and process-based (staging in shared memory),
  counting the staging_completion wait its users place before the optimizer step; dcp.save;
- time to durable: save() until committed on every rank, dcp.save, async_save's upload; and
  what the disk gives writers as the two sides write (fio: 4 jobs, a quarter of the state each,
  8 MiB writes, fsynced; O_DIRECT as zerowait writes, buffered as dcp.save does), its limit;
- resharded restore 4 -> 2: two ranks load zerowait's and DCP's checkpoint of the same state into
  the same 2-rank DTensor targets, cold (files evicted from the page cache) and warm, each result
  checked bit for bit;
- a training loop (matmuls, an all-reduce, AdamW over the state): step times without saves and
  with a save every --save-every steps, by zerowait and by dcp.async_save (DefaultStager); the
  extra time of a saving step and the next one against one memcpy of the state, measured in the
  same run (4 ranks copying their parts with copy_ into memory touched beforehand).

Usage: bench/run checkpoint-sharded [--gib 2.0] [--out DIR] [--json FILE] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common
from common import log

HERE = Path(__file__).resolve().parent
WORKER = HERE / "checkpoint_sharded_worker.py"
SAVE_RANKS, RESTORE_RANKS = 4, 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(phase, world_size, out, options, timeout):
    """Runs the worker's `phase` as `world_size` processes; returns rank 0's report. Exits with
    the failing rank's output when one fails or the phase outlasts `timeout` seconds."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world_size))
    logs = [open(out / f"{phase}-rank{r}.log", "w+") for r in range(world_size)]
    # Each rank leads a session of its own, so that a failure ends it with DCP's saving process.
    ranks = [subprocess.Popen([sys.executable, str(WORKER), phase, str(out), json.dumps(options)],
                              env=dict(env, RANK=str(r)), stdout=logs[r], stderr=subprocess.STDOUT,
                              start_new_session=True) for r in range(world_size)]
    failed = None
    try:
        for r, p in enumerate(ranks):
            if p.wait(timeout=timeout) != 0 and failed is None:
                failed = f"rank {r} exited with code {p.returncode}"
    except subprocess.TimeoutExpired:
        failed = f"the {phase} phase took more than {timeout} s"
    finally:
        for p in ranks:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if failed:
        text = "".join(f"--- rank {r} ---\n{tail(f)}\n"
                       for r, f in enumerate(logs))
        sys.exit(f"bench: {failed}:\n{text}")
    for f in logs:
        f.close()
    return json.loads((out / f"{phase}.json").read_text())


def fmt_load(load):
    return "/".join(f"{x:.1f}" for x in load)


def tail(log_file, chars=3000):
    log_file.seek(0)
    return log_file.read()[-chars:]


def loop_extras(loop, name):
    """(median extra seconds of a saving step and the step after it, mean extra seconds per save
    over the whole run) of the loop run `name`, against the median step without saves. The
    median, not the mean: with steps that vary by 0.1 s or more from one to the next here, a mean
    of three saves moved from -0.3 to 6.6 memcpys between two runs of the same build."""
    run, base = loop["runs"][name], loop["baseline_step_s"]
    times, saves = run["step_s"], run["save_steps"]
    per_save = [times[k] + times[k + 1] - 2 * base for k in saves]
    return statistics.median(per_save), (sum(times) - base * len(times)) / len(saves)


def disk_write_limit(out, nbytes, writers):
    """What the disk gives `writers` writers of `nbytes` in all, each writing its share front to
    back in 8 MiB writes and fsyncing it (fio, psync): (seconds O_DIRECT, seconds buffered), the
    ways zerowait and dcp.save write; None without fio. Timed from outside fio, the fsync in."""
    if shutil.which("fio") is None:
        return None
    block = 8 << 20
    share = max(block, nbytes // writers // block * block)
    folder = out / "fio"
    seconds = []
    for direct in (1, 0):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        start = time.perf_counter()
        common.run_fio(["--name=write", f"--directory={folder}", "--rw=write", f"--bs={block}",
                        "--ioengine=psync", f"--direct={direct}", "--end_fsync=1",
                        f"--numjobs={writers}", "--group_reporting", f"--size={share}"])
        seconds.append(time.perf_counter() - start)
    shutil.rmtree(folder, ignore_errors=True)
    return tuple(seconds)


def save_rows(table, saved, disk):
    """The blocking and durable rows and their ratios; returns the fastest async form's name."""
    total = saved["state_bytes"]
    table.add_row("zerowait save() returns", saved["zerowait"]["blocking_s"], total)
    table.add_row("zerowait save() + next optimizer step's wait", saved["zerowait"]["held_s"],
                  total)
    forms = {"dcp_async_thread": "thread", "dcp_async_process": "process"}
    forms = {key: label for key, label in forms.items() if key in saved}
    for key, label in forms.items():
        table.add_row(f"dcp.async_save {label}: call returns", saved[key]["returns_s"], total)
        table.add_row(f"dcp.async_save {label}: + staging wait", saved[key]["blocking_s"], total)
    table.add_row("dcp.save (blocking, durable)", saved["dcp_save"]["blocking_s"], total)
    table.add_row("zerowait save() to committed (durable)", saved["zerowait"]["durable_s"], total)
    for key, label in forms.items():
        table.add_row(f"dcp.async_save {label}: upload done", saved[key]["durable_s"], total)
    if disk is None:
        table.notes.append("no fio: the disk's write limit was not measured")
    else:
        direct_s, buffered_s = disk
        table.add_row(f"fio: {SAVE_RANKS} writers, O_DIRECT, fsynced (the disk)", direct_s, total)
        table.add_row(f"fio: {SAVE_RANKS} writers, buffered, fsynced (the disk)", buffered_s,
                      total)
        table.notes.append(
            f"durable against the disk written the same way: zerowait {direct_s:.2f} s of fio "
            f"O_DIRECT / {saved['zerowait']['durable_s']:.2f} s = "
            f"{direct_s / saved['zerowait']['durable_s']:.2f}, dcp.save {buffered_s:.2f} s of "
            f"fio buffered / {saved['dcp_save']['durable_s']:.2f} s = "
            f"{buffered_s / saved['dcp_save']['durable_s']:.2f} (1 = at the disk's limit; "
            f"fio's 4 writers share the state as the ranks do)")
    fastest = min(forms, key=lambda key: saved[key]["blocking_s"])
    # Like for like: each side's call and the wait before the optimizer may change the state,
    # placed right after the call (the most either can hold a loop).
    table.judge("save()+step wait / fastest dcp.async_save's",
                saved["zerowait"]["held_s"] / saved[fastest]["blocking_s"], 0.1,
                higher_is_better=False)
    table.judge("save() return / fastest dcp.async_save call",
                saved["zerowait"]["blocking_s"] / saved[fastest]["returns_s"], 0.1,
                higher_is_better=False)
    table.judge("durable: dcp.save s / zerowait s",
                saved["dcp_save"]["durable_s"] / saved["zerowait"]["durable_s"], 1.0,
                higher_is_better=True)
    return forms[fastest]


def restore_rows(table, restored):
    total, loads = restored["state_bytes"], restored["loads"]
    for cache in ("cold", "warm"):
        table.add_row("zerowait load(into=) 4 -> 2 ranks", loads[f"zerowait_{cache}"], total, cache)
        table.add_row("  the same, direct_reads=False", loads[f"zerowait_buffered_{cache}"], total,
                  cache)
        table.add_row("dcp.load 4 -> 2 ranks", loads[f"dcp_{cache}"], total, cache)
    for cache in ("cold", "warm"):
        table.judge(f"restore 4->2 {cache}: dcp.load s / zerowait s",
                    loads[f"dcp_{cache}"] / loads[f"zerowait_{cache}"], 1.0,
                    higher_is_better=True)


def loop_rows(table, loop, args):
    total, memcpy = loop["state_bytes"], loop["memcpy_s"]
    table.add_row("memcpy of the state (4 ranks, copy_)", memcpy, total)
    table.add_row("training step without saves (median)", loop["baseline_step_s"], total)
    extras = {name: loop_extras(loop, name) for name in ("zerowait", "dcp_async")}
    table.add_row("zerowait: extra time of a saving step", extras["zerowait"][0], total)
    table.add_row("dcp.async_save: extra time of a saving step", extras["dcp_async"][0], total)
    table.judge("loop: zerowait extra per save / memcpy", extras["zerowait"][0] / memcpy, 1.2,
                higher_is_better=False)
    saves = len(loop["runs"]["zerowait"]["save_steps"])
    table.notes.append(
        f"training loop: {args.steps} steps, a save every {args.save_every} ({saves} saves), "
        f"{args.matmuls} matmuls of {args.matmul_size}^2 + an all-reduce + AdamW a step; the "
        f"extra time of a saving step counts that step and the next (where DCP's staging wait "
        f"and any wait before the optimizer step fall) against the median step without saves "
        f"(runs before and after), the median over the saves; dcp.async_save extra per save / "
        f"memcpy {extras['dcp_async'][0] / memcpy:.2f}. Over the whole run (background writes "
        f"on the same cores included), extra per save: zerowait {extras['zerowait'][1]:.3f} s, "
        f"dcp.async_save {extras['dcp_async'][1]:.3f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="size of the sharded state")
    parser.add_argument("--out", default=str(common.DEFAULT_OUT / "checkpoint-sharded"),
                        help="work directory (on the filesystem to measure), emptied first")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--repeat", type=int, default=2, help="runs per timed row (best kept)")
    parser.add_argument("--steps", type=int, default=64, help="steps of each training loop run")
    parser.add_argument("--save-every", type=int, default=8, help="steps between saves")
    parser.add_argument("--matmuls", type=int, default=24, help="matmuls in a training step")
    parser.add_argument("--matmul-size", type=int, default=512, help="their square size")
    parser.add_argument("--no-process", action="store_true",
                        help="leave out the process-based dcp.async_save (it starts a saving "
                        "process a rank)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a phase may take")
    args = parser.parse_args()
    if args.steps < args.save_every + 2:
        parser.error("--steps must be at least --save-every + 2 (one save and the step after)")

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    options = {"gib": args.gib, "repeat": args.repeat, "steps": args.steps,
               "save_every": args.save_every, "matmuls": args.matmuls,
               "matmul_size": args.matmul_size, "no_process": args.no_process}
    load_before = os.getloadavg()
    log(f"{SAVE_RANKS} ranks: saves of a {args.gib:.2f} GiB state, then the training loop")
    saved = run_ranks("save", SAVE_RANKS, out, options, args.timeout)
    log(f"{RESTORE_RANKS} ranks: resharded restores")
    restored = run_ranks("restore", RESTORE_RANKS, out, options, args.timeout)

    log("the disk's write limit (fio)")
    disk = disk_write_limit(out, saved["state_bytes"], SAVE_RANKS)

    table = common.Results(repeat=1)
    fastest = save_rows(table, saved, disk)
    restore_rows(table, restored)
    loop_rows(table, saved["loop"], args)
    wrong = {key: names for key, names in restored["wrong"].items() if names}
    table.notes.append(
        f"state: {saved['state_bytes'] / (1 << 30):.2f} GiB of DTensors Shard(0) over "
        f"{SAVE_RANKS} ranks, restored onto {RESTORE_RANKS}; torch {saved['torch']}; best of "
        f"{args.repeat} per row after a warm-up save; the fastest dcp.async_save form here: "
        f"{fastest}; DefaultStager's pinned staging and non-blocking copies need CUDA "
        f"({'used' if saved['cuda'] else 'not available here'})")
    table.notes.append("cold = the checkpoints' files evicted with posix_fadvise(DONTNEED); warm "
                       "= read once before; zerowait reads with O_DIRECT by default "
                       "(direct_reads=True), so its warm and cold reads both come from the "
                       "disk; the rows 'direct_reads=False' read through the page cache and are "
                       "not judged")
    load_after = os.getloadavg()
    table.notes.append(f"load average (1, 5, 15 min) at the start {fmt_load(load_before)}, at "
                       f"the end {fmt_load(load_after)}, on {os.cpu_count()} CPUs")
    table.notes.append("restores checked bit for bit on every rank: " + (
        "all exact" if not wrong else f"NOT EXACT: {wrong}"))
    common.print_table(table.rows, table.ratios, table.notes)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"rows": table.rows, "ratios": table.ratios, "notes": table.notes,
             "exact": not wrong, "load_average": [load_before, load_after], "save": saved,
             "restore": restored}, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    if wrong:
        return 2
    return 0 if all(r["result"] == "PASS" for r in table.ratios) else 1


if __name__ == "__main__":
    sys.exit(main())
