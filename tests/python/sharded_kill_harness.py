"""kill -9 at random moments of a 4-rank sharded save, round after round; then what is left is
judged.

    python tests/python/sharded_kill_harness.py --rounds 100 --backend zerowait|dcp|dcp-overwrite
        [--seed N] [--dir DIR] [--max-wait SECONDS] [--json FILE] [--verbose]

Each round starts 4 ranks (gloo on the CPU, forked from a forkserver that has torch and zerowait
imported, so that a round costs no imports) that save successive steps of a sharded state of
about 3 MiB: DTensors with Shard(0), Shard(1), an int64 Shard(0), an HSDP placement on a 2x2
mesh (Replicate, Shard(0)) and a Replicate tensor. Every element encodes the step that wrote it
(the tensor's base pattern plus the step), so that a step holding another step's bytes, or a mix
of steps, is found. After a random moment (uniform in 0..--max-wait seconds after every rank is
ready), every rank is killed with SIGKILL, or, every other round, one random rank is and the
others 0.1-0.5 s later (as a launcher tears the job down after one rank died).

- zerowait: the ranks save into one directory across rounds (keep_last=3; each round resumes
  at the newest committed step + 1), every save asynchronous, the state changed in place as soon
  as save() returns. After each kill, every step that ``Checkpointer.steps()`` lists must verify
  (``ckpt verify``'s checks), load with ``fallback=False`` for each of the 4 ranks' parts and
  hold exactly that step's values in every element of every tensor and the rank's own per-rank
  values; ``load()`` must return the newest. A listed step that fails any of this is counted as
  a torn or mixed step accepted (the harness exits 1 if there is one). The newest committed step
  never goes back.
- dcp: ``torch.distributed.checkpoint.save`` to a new FileSystemWriter directory per step
  (``step-N``) in a directory of the round's own. Every directory left is classified: no
  ``.metadata``; ``.metadata`` but ``dcp.load`` raises; loads but holds values of another step
  or of several; loads complete and correct.
- dcp-overwrite: the same, every step saved into one directory (``latest``), as a job that keeps
  one checkpoint does; its one directory is classified alike.

Prints a table and, with --json, writes the counts there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import free_port  # noqa: E402

WORLD = 4
# What the ranks would otherwise import in each round (a DTensor's first dispatch imports
# torch._dynamo and what it needs: seconds on a busy machine).
PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.checkpoint",
           "torch.distributed.device_mesh", "torch._dynamo", "torch._inductor.config", "fsspec",
           "numpy.random", "zerowait"]
# name: (global shape, dtype name, placements kind)
TENSORS = {
    "w": ((512, 384), "float32", "shard0"),
    "v": ((300, 512), "float32", "shard1"),
    "ids": ((256, 384), "int64", "shard0"),
    "hsdp": ((257, 256), "float32", "hsdp"),
    "rep": ((64, 33), "float32", "replicate"),
}
INT_STEP_SHIFT = 32  # an int64 element holds base + (step << 32)


def expected_full(name: str, step: int):
    """The whole tensor `name` as step `step` holds it."""
    import torch

    shape, dtype, _ = TENSORS[name]
    base = torch.arange(int(torch.tensor(shape).prod()), dtype=getattr(torch, dtype))
    offset = step << INT_STEP_SHIFT if dtype == "int64" else step
    return (base + offset).reshape(shape)


_BASES: dict = {}


def steps_held(name: str, tensor) -> set:
    """The steps the elements of a whole tensor `name` encode (one for an untorn tensor)."""
    import torch

    if name not in _BASES:
        _BASES[name] = expected_full(name, 0).reshape(-1)
    diff = tensor.reshape(-1) - _BASES[name]
    if bool((diff == diff[0]).all()):  # the usual case, without sorting
        return {diff[0].item() >> INT_STEP_SHIFT if tensor.dtype == torch.int64
                else diff[0].item()}
    if tensor.dtype == torch.int64:
        # Elements of a step have no low bits; anything else is not a step's value at all.
        return set((diff >> INT_STEP_SHIFT).unique().tolist()) | (
            {"garbage"} if bool(((diff & ((1 << INT_STEP_SHIFT) - 1)) != 0).any()) else set())
    return set(diff.unique().tolist())


# --- one rank (a forkserver child) --------------------------------------------------------------


def _placed_state(step: int) -> dict:
    import torch.distributed.tensor as dt
    from torch.distributed.device_mesh import init_device_mesh

    flat = init_device_mesh("cpu", (WORLD,))
    square = init_device_mesh("cpu", (2, WORLD // 2))
    where = {"shard0": (flat, [dt.Shard(0)]), "shard1": (flat, [dt.Shard(1)]),
             "hsdp": (square, [dt.Replicate(), dt.Shard(0)]),
             "replicate": (flat, [dt.Replicate()])}
    return {name: dt.distribute_tensor(expected_full(name, step), *where[kind])
            for name, (_, _, kind) in TENSORS.items()}


def rank_main(backend: str, root: str, rank: int, port: int, ready) -> None:
    """Saves steps of the sharded state until killed; tells `ready` before the first save."""
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    if not os.environ.get("HARNESS_DEBUG"):
        # Survivors of a round that killed one rank fail their collectives and say so at length.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    if backend == "zerowait":
        import zerowait

        ckpt = zerowait.Checkpointer(root, keep_last=3, piece_bytes=64 << 10, commit_timeout=60)
        first = [(ckpt.latest() or 0) + 1]
        dist.broadcast_object_list(first, src=0)  # every rank starts at rank 0's newest + 1
        step = first[0]
    else:
        import torch.distributed.checkpoint as dcp

        step = 1
    state = _placed_state(step)
    ready.send(step)
    ready.close()
    while True:
        if backend == "zerowait":
            ckpt.save(step, {"model": state, "step": step, "rank": rank})  # asynchronous
        else:
            target = f"step-{step}" if backend == "dcp" else "latest"
            dcp.save({"model": state, "step": step}, checkpoint_id=os.path.join(root, target))
        step += 1
        for tensor in state.values():  # the next step's values, changed in place
            tensor.to_local().add_(1 if tensor.dtype != torch.int64 else 1 << INT_STEP_SHIFT)


# --- the judge (this process) -------------------------------------------------------------------


def judge_zerowait(root: Path, newest_before: int, counts: Counter, checked: set) -> int:
    """Checks every committed step; returns the newest. Counts into `counts`. A step in
    `checked` (its values checked after an earlier kill) has its checksums verified again."""
    import zerowait
    from zerowait import _core

    left = [int(p.name[len("step-"):-len(".tmp")]) for p in root.glob("step-*.tmp")]
    # Opened as the job's rank 0 opens it when it restarts: a step-N.tmp above the newest
    # committed step stays (another rank may be writing it), and the next round saves into it.
    with zerowait.Checkpointer(root, rank=0, world_size=WORLD) as listing:
        steps = listing.steps()
    newest = steps[-1] if steps else 0
    if any(n > newest_before for n in left):
        counts["rounds that left a new step-N.tmp (a save cut short)"] += 1
    if newest + 1 in left:
        counts["rounds after which the next saves into a dead step-N.tmp"] += 1
    if newest < newest_before:
        counts["newest step went back"] += 1
    for step in steps:
        problems = []
        try:
            problems += _core._ckpt_verify(str(root), step)["problems"]
            for rank in range(WORLD) if step not in checked else ():
                with zerowait.Checkpointer(root, rank=rank, world_size=WORLD) as reader:
                    part = reader.load(step, fallback=False)
                if part["step"] != step or part["rank"] != rank:
                    problems.append(f"rank {rank}: per-rank values {part['step']}, {part['rank']}")
                for name in TENSORS:
                    held = steps_held(name, part["model"][name])
                    if held != {step}:
                        problems.append(f"rank {rank}: {name} holds steps {sorted(map(str, held))}")
        except Exception as error:  # noqa: BLE001 - a listed step that does not load is torn
            problems.append(f"{type(error).__name__}: {error}")
        if problems:
            counts["torn or mixed steps accepted"] += 1
            print(f"  step {step} is listed but: {problems[:3]}", file=sys.stderr)
        elif step not in checked:
            counts["committed steps checked, whole"] += 1
            checked.add(step)
    if steps:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with zerowait.Checkpointer(root, rank=0, world_size=WORLD) as resumed:
                resumed.load()
        if resumed.loaded_step != newest:
            counts["load() did not return the newest step"] += 1
    return newest


DCP_KINDS = ("no .metadata (dcp.load raises)", ".metadata, but dcp.load raises",
             "loads, mixed steps", "loads, another step's values", "loads complete and correct")


def classify_dcp(directory: Path, step) -> str:
    """What a DCP checkpoint directory left by a kill holds: its step is `step` (None: any one)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    if not (directory / ".metadata").exists():
        return DCP_KINDS[0]
    state = {"model": {name: torch.zeros(shape, dtype=getattr(torch, dtype))
                       for name, (shape, dtype, _) in TENSORS.items()}, "step": -1}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(state, checkpoint_id=str(directory))
    except (Exception, CheckpointException):  # noqa: BLE001 - what is being classified
        return DCP_KINDS[1]
    held = set().union(*(steps_held(name, t) for name, t in state["model"].items()))
    wanted = {state["step"]} if step is None else {step, state["step"]}
    if len(held) > 1:
        return DCP_KINDS[2]
    if held != wanted:
        return DCP_KINDS[3]
    return DCP_KINDS[4]


def run_round(ctx, backend: str, root: Path, rng: random.Random, kill_one: bool,
              max_wait: float, timings: dict) -> str:
    """Starts the ranks, kills them at a random moment; returns how they died."""
    port = free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(WORLD)]
    ranks = [ctx.Process(target=rank_main, args=(backend, str(root), r, port, pipes[r][1]))
             for r in range(WORLD)]
    for p in ranks:
        p.start()
    for receiving, sending in pipes:
        sending.close()
    try:
        for receiving, _ in pipes:
            if not receiving.poll(120):
                raise RuntimeError("a rank did not get ready within 120 s")
            receiving.recv()
        timings["ready"] = time.monotonic()
        time.sleep(rng.uniform(0.0, max_wait))
        if kill_one:
            ranks[rng.randrange(WORLD)].kill()
            time.sleep(rng.uniform(0.1, 0.5))
        for p in ranks:
            if p.exitcode is None:
                p.kill()  # SIGKILL; quiet if it ended by itself since (its collective failed)
    finally:
        for p in ranks:
            if p.exitcode is None and p.is_alive():
                p.kill()
            p.join(60)
        for receiving, _ in pipes:
            receiving.close()
    died = [p.exitcode for p in ranks]
    if not kill_one and died != [-signal.SIGKILL] * WORLD:
        raise RuntimeError(f"a rank ended before the kill: exit codes {died}")
    return "one rank, then the rest" if kill_one else "all at once"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--backend", choices=["zerowait", "dcp", "dcp-overwrite"],
                        default="zerowait")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--dir", help="where the checkpoints go (default: a temporary directory)")
    parser.add_argument("--max-wait", type=float, default=1.0,
                        help="the kill lands uniformly within this many seconds of readiness")
    parser.add_argument("--json", help="write the counts to this file")
    parser.add_argument("--verbose", action="store_true", help="one line per round")
    args = parser.parse_args(argv)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)  # the judge is one process, whatever launched it

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="sharded-kill-"))
    base.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    counts: Counter = Counter()
    newest, checked = 0, set()
    started = time.monotonic()
    try:
        for round_ in range(args.rounds):
            kill_one = round_ % 2 == 1
            root = base / "ckpt" if args.backend == "zerowait" else base / f"round-{round_}"
            timings = {"start": time.monotonic()}
            counts["kills: " + run_round(ctx, args.backend, root, rng, kill_one,
                                         args.max_wait, timings)] += 1
            timings["killed"] = time.monotonic()
            if args.backend == "zerowait":
                newest_before = newest
                newest = judge_zerowait(root, newest, counts, checked)
                what = f"newest committed step {newest} (+{newest - newest_before})"
            else:
                dirs = sorted(root.glob("step-*") if args.backend == "dcp" else [root / "latest"],
                              key=lambda p: int(p.name.split("-")[1]) if "-" in p.name else 0)
                dirs = [d for d in dirs if d.exists()]
                kinds = [classify_dcp(d, int(d.name.split("-")[1]) if args.backend == "dcp"
                                      else None) for d in dirs]
                counts.update(f"directories: {k}" for k in kinds)
                if kinds:
                    counts[f"newest directory: {kinds[-1]}"] += 1
                what = f"{len(dirs)} directories: {dict(Counter(kinds))}"
                shutil.rmtree(root)
            if args.verbose:
                print(f"round {round_}: {what}; ready after "
                      f"{timings['ready'] - timings['start']:.1f} s, killed after "
                      f"{timings['killed'] - timings['ready']:.1f} s, judged in "
                      f"{time.monotonic() - timings['killed']:.1f} s", flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    seconds = time.monotonic() - started
    print(f"{args.backend}: {args.rounds} rounds of kill -9 during 4-rank sharded saves, "
          f"{seconds:.0f} s, load average {open('/proc/loadavg').read().split()[0]}")
    width = max(map(len, counts), default=10)
    for key in sorted(counts):
        print(f"  {key:<{width}}  {counts[key]:>6}")
    if args.json:
        Path(args.json).write_text(json.dumps({"backend": args.backend, "rounds": args.rounds,
                                               "seconds": seconds, "counts": counts}, indent=1))
    bad = counts["torn or mixed steps accepted"] + counts["newest step went back"] + counts[
        "load() did not return the newest step"]
    return 1 if args.backend == "zerowait" and bad else 0


if __name__ == "__main__":
    sys.exit(main())
