#!/usr/bin/env python3
"""A multi-node training job: torchrun on every node, data from s3:// through each node's
cache, checkpoints mirrored to s3://, a StepProfiler on every rank.

    # once: a generated dataset, packed straight into a bucket (hash-prefixed shards)
    python examples/multinode_train.py generate --out s3://bucket/ds --samples 192

    # on every node (torch.distributed elastic; the c10d rendezvous numbers the nodes)
    torchrun --nnodes 3 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint NODE0:29400 \\
        --rdzv-id job-7 --max-restarts 1 \\
        examples/multinode_train.py train --data s3://bucket/ds --ckpt /shared/ckpt \\
        --mirror s3://bucket/ckpt --out /shared/run --epochs 2

scripts/cluster.sh runs the same on one host (docs/scale.md, "A cluster on one host").

Each node reads its own share of the data set: ``Loader(nodes=N, node=GROUP_RANK,
rank=LOCAL_RANK, world_size=LOCAL_WORLD_SIZE)``, the node-stable block order (docs/loader.md,
"Order"), through the node's default cache directory (``ZEROWAIT_CACHE_DIR``, shared by the
node's ranks; docs/cache.md), so from the second epoch on a node reads its share from local disk.
The model is a small classifier; its gradients are averaged over all ranks (gloo) every step.

At the end of every epoch (and every ``--ckpt-every`` steps) each rank saves its part of the
step (model, optimizer, loader position, step) into ``--ckpt``, which every rank must reach (a
shared file system, or an s3:// prefix): rank 0 commits a step once every rank's part is there.
With ``--mirror`` each committed step is copied there in the background. A restarted job
(torchrun ``--max-restarts``, or the same command again) resumes from the newest step that
every rank can load, loader state included, so the epoch goes on where that step left it.

What every rank writes under ``--out``:

- ``keys-rank-R.jsonl``: one line a training step: ``attempt`` (when rank 0 started this
  attempt of the job, Unix seconds), ``restart`` (torchrun's restart count), ``epoch``,
  ``step``, ``rank``, ``node``, ``time`` (when the step ended, Unix seconds), ``keys`` (the
  samples trained). ``trained_keys()`` reads them
  back as the keys each epoch trained, leaving out what an attempt trained after the step a
  later attempt resumed from (work lost with the attempt, and trained again);
- ``epochs-rank-R.jsonl``: one line an epoch: the samples and steps, and the node-local
  cache's counters over the epoch (``data_gets``: blocks this rank downloaded, on demand or
  ahead; ``bytes_downloaded``; ``hits``; ``waits``: blocks another rank of the node was
  downloading), with ``cluster_node`` (``ZW_CLUSTER_NODE`` when run by scripts/cluster.sh) and
  the cache directory;
- ``profile/rank-R/``: the StepProfiler's run directory (``zerowait report`` draws it).

Rank 0 prints the GETs and bytes each node fetched per epoch.

For fault tests (docs/scale.md, "Faults across nodes"): ``--step-sleep`` paces the steps so
that a fault lands mid-epoch, ``--timeout`` bounds every collective and commit, and
``--read-timeout`` the loader's reads (``--cache-bytes`` and ``--prefetch`` bound how far
ahead it reads, so that a stalled store meets reads still to come). A gradient all_reduce
that fails (a peer gone, or silent past ``--timeout``) is raised naming the collective, the
step and how long it waited. A node started again after a crash joins the restarted group only
with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` on every node (docs/scale.md says why).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, List

import numpy as np

import zerowait

# torch is imported where training needs it: `generate` runs without it (importing torch takes
# a few seconds of CPU, in every process).
if TYPE_CHECKING:
    import torch

FEATURES, CLASSES = 64, 8


# --- the data set --------------------------------------------------------------------------


def generate(out: str, samples: int, payload_bytes: int, shard_bytes: int) -> Dict:
    """`samples` samples: `x` (FEATURES float32 features), `cls` (the argmax of a fixed
    projection of x: learnable) and `payload` (random bytes standing for an image)."""
    rng = np.random.default_rng(0)
    projection = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)

    def rows() -> Iterable[Dict]:
        for i in range(samples):
            x = rng.standard_normal(FEATURES).astype(np.float32)
            yield {"__key__": f"sample-{i:06d}", "x": x, "cls": str(int((x @ projection).argmax())),
                   "payload": rng.integers(0, 256, payload_bytes, dtype=np.uint8).tobytes()}

    return zerowait.write_dataset(rows(), out, shard_size=shard_bytes)


# --- what the ranks wrote ------------------------------------------------------------------


def read_jsonl(out: Path, prefix: str) -> List[Dict]:
    """Every line of OUT/PREFIX-rank-*.jsonl, in file order per rank."""
    lines = []
    for path in sorted(Path(out).glob(f"{prefix}-rank-*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines


def trained_keys(out: Path) -> Dict[int, List[str]]:
    """epoch -> every sample key trained in it, over all ranks (a key twice if trained twice).
    An attempt of the job that resumed from step S threw away what earlier attempts trained after
    S: their steps after S do not count."""
    lines = read_jsonl(out, "keys")
    first: Dict[float, int] = {}  # attempt -> the first step it trained
    for line in lines:
        first[line["attempt"]] = min(first.get(line["attempt"], line["step"]), line["step"])
    epochs: Dict[int, List[str]] = {}
    for line in lines:
        if not any(later > line["attempt"] and start <= line["step"]
                   for later, start in first.items()):
            epochs.setdefault(line["epoch"], []).extend(line["keys"])
    return epochs


# --- training ------------------------------------------------------------------------------


def env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        sys.exit(f"multinode_train.py train: {name} is not set; start it with torchrun "
                 "(examples/multinode_train.py's docstring shows the command)")
    return int(value)


def append_jsonl(path: Path, record: Dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def features(batch: Dict) -> torch.Tensor:
    return batch["x"].float()


def average_gradients(model: torch.nn.Module, world: int, step: int) -> None:
    """All-reduces every gradient over the job; a failure (a rank gone, or silent past the
    process group's timeout) is raised naming the collective and the step, which gloo's own
    message does not."""
    import torch.distributed as dist

    started = time.monotonic()
    try:
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
    except RuntimeError as error:
        raise RuntimeError(f"all_reduce of the gradients of step {step} failed after "
                           f"{time.monotonic() - started:.1f} s: {error}") from error


CACHE_COUNTERS = ("misses", "prefetched", "hits", "waits", "bytes_downloaded", "bytes_hit")


def cache_counters(loader: zerowait.Loader) -> Dict[str, int]:
    cache = loader.stats().get("cache") or {}
    return {name: int(cache.get(name, 0)) for name in CACHE_COUNTERS}


def train(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    local_rank, local_world = env_int("LOCAL_RANK"), env_int("LOCAL_WORLD_SIZE")
    node, nodes = env_int("GROUP_RANK"), world // local_world
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # a tiny model; more threads would only contend on shared cores
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    # This attempt's name: when rank 0 started it, so that a later attempt (a torchrun restart
    # or the command run again) orders after every earlier one.
    attempt = [time.time()]
    dist.broadcast_object_list(attempt, src=0)
    attempt = attempt[0]

    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Linear(FEATURES, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # The node's share of the data set: node-stable blocks, numbered within the node.
    loader = zerowait.Loader(args.data, batch_size=args.batch_size, shuffle="block",
                             block_bytes=args.block_bytes, nodes=nodes, node=node,
                             rank=local_rank, world_size=local_world, seed=args.seed,
                             threads=args.threads, keys=True, fields=["x", "cls"],
                             decode={"x": "npy", "cls": "int"}, prefetch=args.prefetch,
                             read_timeout=args.read_timeout, cache_bytes=args.cache_bytes)
    # One run id for every attempt of the job, so that a restarted attempt's steps and the
    # mirror's copies of the earlier ones are the same run's.
    run_id = hashlib.sha256(os.environ.get("TORCHELASTIC_RUN_ID", "job").encode()).hexdigest()[:16]
    ckpt = zerowait.Checkpointer(args.ckpt, mirror=args.mirror, keep_last=args.keep_last,
                                 run_id=run_id, commit_timeout=args.timeout)
    step = 0
    try:
        state = ckpt.load()  # collective: the newest step every rank can load
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        step = int(state["step"])
        if rank == 0:
            print(f"resumed from step {step} (epoch {loader.epoch}), torchrun restart {restart}",
                  flush=True)
    except FileNotFoundError:
        pass  # no step committed yet: a fresh start

    def save() -> None:
        ckpt.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "loader": loader.state_dict(), "step": step})

    keys_log = out / f"keys-rank-{rank:03d}.jsonl"
    epochs_log = out / f"epochs-rank-{rank:03d}.jsonl"
    prof = zerowait.StepProfiler(loader, ckpt, out=out / "profile" / f"rank-{rank:03d}",
                                 interval=0.5,
                                 title=f"multinode_train.py rank {rank} (node {node})")
    # From zero: what the loader fetched while it was made (the first sample, which tells
    # decode="npy" the arrays' dtype and shape) counts in the first epoch.
    before = dict.fromkeys(CACHE_COUNTERS, 0)
    with prof:
        while loader.epoch < args.epochs:
            epoch = loader.epoch
            samples = steps = 0
            for batch in loader:  # the rest of the epoch, from where the loader stands
                with prof.step(samples=len(batch["__key__"])):
                    loss = F.cross_entropy(model(features(batch)), batch["cls"])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    with prof.phase("communication"):
                        average_gradients(model, world, step + 1)
                    optimizer.step()
                step += 1
                steps += 1
                samples += len(batch["__key__"])
                append_jsonl(keys_log, {"attempt": attempt, "restart": restart, "epoch": epoch,
                                        "step": step, "rank": rank, "node": node,
                                        "time": time.time(), "keys": list(batch["__key__"])})
                if args.ckpt_every and step % args.ckpt_every == 0 and loader.remaining():
                    save()
                time.sleep(args.step_sleep)
            save()  # the loader now stands at the start of the next epoch
            after = cache_counters(loader)
            spent = {name: after[name] - before[name] for name in CACHE_COUNTERS}
            before = after
            record = {"attempt": attempt, "restart": restart, "epoch": epoch, "rank": rank,
                      "node": node, "local_rank": local_rank,
                      "cluster_node": os.environ.get("ZW_CLUSTER_NODE", socket.gethostname()),
                      "cache_dir": zerowait.default_cache_dir(), "samples": samples,
                      "steps": steps, "loss": float(loss.detach()),
                      "data_gets": spent["misses"] + spent["prefetched"], **spent}
            append_jsonl(epochs_log, record)
            report_epoch(record, world)
    ckpt.wait()  # every save committed and mirrored (or raises)
    loader.close()
    ckpt.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def report_epoch(record: Dict, world: int) -> None:
    """Rank 0 prints what each node fetched from the store in the epoch (its ranks summed)."""
    import torch.distributed as dist

    records: List[Dict] = [{} for _ in range(world)]
    dist.all_gather_object(records, record)
    if dist.get_rank() != 0:
        return
    per_node: Dict[int, Dict[str, int]] = {}
    for r in records:
        totals = per_node.setdefault(r["node"], {"samples": 0, "data_gets": 0,
                                                 "bytes_downloaded": 0, "hits": 0, "waits": 0})
        for name in totals:
            totals[name] += r[name]
    for node, t in sorted(per_node.items()):
        print(f"epoch {record['epoch']} node {node}: {t['samples']} samples, "
              f"{t['data_gets']} GETs, {t['bytes_downloaded'] / 2**20:.1f} MiB downloaded, "
              f"{t['hits']} cache hits, {t['waits']} waits", flush=True)


# --- command line --------------------------------------------------------------------------


def parse_args(argv: List[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="write the generated data set to --out")
    g.add_argument("--out", required=True, help="a directory or s3://BUCKET/PREFIX")
    g.add_argument("--samples", type=int, default=192)
    g.add_argument("--payload-bytes", type=int, default=512 << 10,
                   help="random bytes per sample beside its features (default 512 KiB)")
    g.add_argument("--shard-bytes", type=int, default=16 << 20)
    t = sub.add_parser("train", help="one rank of the job (started by torchrun)")
    t.add_argument("--data", required=True, help="the data set: s3://BUCKET/PREFIX or a path")
    t.add_argument("--ckpt", required=True,
                   help="checkpoint directory every rank reaches: a shared path or s3://")
    t.add_argument("--mirror", default=None, help="a second tier, e.g. s3://BUCKET/run")
    t.add_argument("--out", required=True, help="where each rank writes its logs and profile")
    t.add_argument("--epochs", type=int, default=2)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--block-bytes", type=int, default=256 << 10,
                   help="the loader's block (default 256 KiB: below the generated samples' "
                        "size, so each block is one sample and the nodes' shares are equal)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=1, help="loader threads per rank")
    t.add_argument("--prefetch", type=int, default=4, help="batches the loader reads ahead")
    t.add_argument("--read-timeout", type=float, default=30,
                   help="the loader's deadline for each batch's reads, seconds (S3 requests "
                        "are retried within it)")
    t.add_argument("--cache-bytes", type=int, default=0,
                   help="cap of the node's cache (0: the default); the cache reads ahead at "
                        "most a quarter of it")
    t.add_argument("--step-sleep", type=float, default=0,
                   help="seconds to sleep after every step (fault tests: a fault lands "
                        "mid-epoch)")
    t.add_argument("--ckpt-every", type=int, default=0,
                   help="also save every N steps (0: at the end of each epoch only)")
    t.add_argument("--keep-last", type=int, default=2)
    t.add_argument("--timeout", type=float, default=120,
                   help="seconds a collective or a checkpoint commit may wait for other ranks")
    return p.parse_args(argv)


def main(argv: List[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "generate":
        started = time.monotonic()
        report = generate(args.out, args.samples, args.payload_bytes, args.shard_bytes)
        print(f"wrote {report['samples']} samples in {report['shards']} shards to {args.out} "
              f"in {time.monotonic() - started:.1f} s")
        return 0
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
