"""One rank of the sharded checkpoint benchmark; checkpoint_sharded.py starts the ranks as
processes (gloo on 127.0.0.1, RANK / WORLD_SIZE / MASTER_* in the environment).

    checkpoint_sharded_worker.py save OUT OPTIONS_JSON      4 ranks: saves, then the training loop
    checkpoint_sharded_worker.py restore OUT OPTIONS_JSON   2 ranks: resharded restores

Rank 0 writes what it measured to OUT/<phase>.json; every time in it is the slowest rank's.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh

import zerowait
from checkpoint_sharded_state import (StateCopy, layer_shapes, max_over_ranks, mismatches,
                                      sharded, state_bytes, synthetic_state, timed, wall,
                                      zero_)

GiB = 1 << 30
ZEROWAIT_DIR = "zw"  # the saves' zerowait checkpoints, restored by the restore phase
DCP_DIR = "dcp-saved"  # dcp.save's checkpoint, restored by the restore phase


class Rank:
    """This rank's process group, mesh, options and work folder."""

    def __init__(self, out, options):
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.mesh = init_device_mesh("cpu", (self.world,))
        self.out, self.options = Path(out), options
        self.shapes = layer_shapes(int(options["gib"] * GiB))
        # DCP's background saves run collectives while the loop runs its own: a group of their
        # own, as torchtitan gives them.
        self.dcp_group = dist.new_group(backend="gloo")

    def log(self, message):
        if self.rank == 0:
            print(f"[bench rank 0] {message}", file=sys.stderr, flush=True)

    def remove(self, path):
        """Removes `path` once every rank is done with it."""
        dist.barrier()
        if self.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dist.barrier()


def dcp_stager(process):
    """DCP's DefaultStager in its fastest form on this machine: staging on its own thread
    (async_save returns before the copy ends), the staged copies cached and reused by the next
    save, in shared memory for the process-based saver (so handing them to the saving process
    copies nothing). Pinned memory and non-blocking copies need an accelerator: only with CUDA."""
    accelerator = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=accelerator,
                                        use_shared_memory=process, use_async_staging=True,
                                        use_non_blocking_copy=accelerator))


# ---- 1. saves of a state that does not change -------------------------------------------------

def owning_optimizer(state):
    """An AdamW that owns the state as a training job's does: the model's DTensors are its
    parameters and the saved moments its state. Its step here has no gradients, so it changes
    nothing; it makes the optimizer known to zerowait's step hook (installed with the first
    Checkpointer), so save() copies these tensors in the background as it would in training."""
    params = state["model"]
    optimizer = torch.optim.AdamW(list(params.values()), lr=0.0, weight_decay=0.0)
    for name, param in params.items():
        optimizer.state[param] = state["optim"]["state"][name]
    optimizer.step()
    return optimizer


def zerowait_saves(rank, state):
    """save() (what the caller waits for), save() followed at once by an optimizer step (which
    waits for the background copy: the most a loop can be held, with no forward or backward
    between) and save() to committed on every rank, after one warm-up save that pre-faults the
    staging pool."""
    ckpt = zerowait.Checkpointer(rank.out / ZEROWAIT_DIR, keep_last=1)
    optimizer = owning_optimizer(state)
    ckpt.save(0, state).wait()
    blocking, held, durable = [], [], []
    for step in range(1, rank.options["repeat"] + 1):
        dist.barrier()
        start = time.perf_counter()
        handle = ckpt.save(step, state)
        returned = time.perf_counter() - start
        optimizer.step()  # no gradients: only the wait for the copy
        stepped = time.perf_counter() - start
        result = handle.wait()
        done = time.perf_counter() - start
        if not result["committed"]:
            raise RuntimeError(f"zerowait step {step} was not committed")
        blocking.append(max_over_ranks(returned))
        held.append(max_over_ranks(stepped))
        durable.append(max_over_ranks(done))
    ckpt.close()
    return {"blocking_s": min(blocking), "held_s": min(held), "durable_s": min(durable)}


def dcp_saves(rank, state):
    """dcp.save (blocking until the files are written and fsynced), after one warm-up save; the
    last checkpoint stays for the restore phase."""
    seconds = []
    for i in range(rank.options["repeat"] + 1):
        path = rank.out / DCP_DIR
        rank.remove(path)
        took, _ = timed(lambda: dcp.save(state, checkpoint_id=path))
        if i > 0:
            seconds.append(took)
    return {"blocking_s": min(seconds), "durable_s": min(seconds)}


def dcp_async_saves(rank, state, process):
    """dcp.async_save with a DefaultStager, thread- or process-based, after one warm-up save
    (which also starts the saving process): how long the call takes to return, how long until
    staging completes (the wait the caller must place before the optimizer changes the state)
    and until the upload completes."""
    stager = dcp_stager(process)
    kind = AsyncCheckpointerType.PROCESS if process else AsyncCheckpointerType.THREAD
    returns, staged, durable = [], [], []
    path = rank.out / f"dcp-async-{'process' if process else 'thread'}"
    for i in range(rank.options["repeat"] + 1):
        rank.remove(path)
        dist.barrier()
        start = time.perf_counter()
        response = dcp.async_save(state, checkpoint_id=path, async_stager=stager,
                                  async_checkpointer_type=kind, process_group=rank.dcp_group)
        returned = time.perf_counter() - start
        response.staging_completion.result()
        staging = time.perf_counter() - start
        response.upload_completion.result()
        done = time.perf_counter() - start
        if i > 0:
            returns.append(max_over_ranks(returned))
            staged.append(max_over_ranks(staging))
            durable.append(max_over_ranks(done))
    stager.close()
    rank.remove(path)
    if process:
        stop_dcp_saving_process()
    return {"returns_s": min(returns), "blocking_s": min(staged), "durable_s": min(durable)}


def stop_dcp_saving_process():
    """Ends DCP's saving process now rather than at exit: it holds the last staged state it was
    sent (shared memory, as large as the state) for the life of the rank, which the training loop
    after it would otherwise run beside. DCP offers no public call for this (torch 2.14)."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    saver = getattr(executor, "_CHECKPOINT_PROCESS", None)
    if saver is not None:
        executor._CHECKPOINT_PROCESS = None
        saver.__del__()  # sends TERMINATE and joins it (SIGTERM after 5 s)


# ---- 2. a training loop -----------------------------------------------------------------------

class Model:
    """A training state of DTensor parameters (Shard(0)) and torch.optim.AdamW, whose step does a
    fixed amount of compute (matmuls standing in for forward and backward), a small all-reduce
    (the ranks move in lockstep, as gradient reduction makes them) and the optimizer step."""

    def __init__(self, rank):
        self.params = {}
        for index, (name, shape) in enumerate(rank.shapes):
            param = torch.nn.Parameter(sharded(shape, rank.mesh, 3 * index + 1))
            param.grad = sharded(shape, rank.mesh, 3 * index + 2) * 1e-3  # the same every step
            self.params[name] = param
        self.optimizer = torch.optim.AdamW(self.params.values(), lr=1e-4, foreach=True)
        size = rank.options["matmul_size"]
        generator = torch.Generator().manual_seed(rank.rank)
        self.a = torch.randn(size, size, generator=generator)
        self.b = torch.randn(size, size, generator=generator)
        self.product = torch.empty(size, size)
        self.matmuls = rank.options["matmuls"]
        self.loss = torch.zeros(1)

    def compute(self):
        for _ in range(self.matmuls):
            torch.mm(self.a, self.b, out=self.product)
        self.loss[0] = self.product[0, 0]
        dist.all_reduce(self.loss)

    def state(self):
        """What a user saves: the parameters (as model.state_dict() gives them) and AdamW's state
        keyed by parameter name."""
        return {"model": {name: p.detach() for name, p in self.params.items()},
                "optim": {"state": {name: self.optimizer.state[p]
                                    for name, p in self.params.items()}}}


class ZerowaitSaver:
    """save() every N steps; nothing else in the loop."""

    def __init__(self, rank, model):
        self.model = model
        self.ckpt = zerowait.Checkpointer(rank.out / "loop-zw", keep_last=1)
        self.ckpt.save(0, model.state()).wait()  # warm-up: pre-faults the staging pool

    def before_optimizer_step(self):
        pass

    def save(self, step):
        self.ckpt.save(step, self.model.state())

    def close(self):
        self.ckpt.close()


class DcpSaver:
    """dcp.async_save with a DefaultStager every N steps, with the two waits its users place: the
    previous upload before the next async_save (one save in flight), and staging before the
    optimizer step changes the state."""

    def __init__(self, rank, model):
        self.rank, self.model = rank, model
        self.stager = dcp_stager(process=False)
        self.response, self.staged = None, True
        self.save(0)  # warm-up: the stager's cached copies are made
        self.finish()

    def before_optimizer_step(self):
        if not self.staged:
            self.response.staging_completion.result()
            self.staged = True

    def save(self, step):
        if self.response is not None:
            self.response.upload_completion.result()
        # One folder, overwritten by each save (as zerowait's keep_last=1 keeps one step).
        self.response = dcp.async_save(
            self.model.state(), checkpoint_id=self.rank.out / "loop-dcp",
            async_stager=self.stager, process_group=self.rank.dcp_group)
        self.staged = False

    def finish(self):
        self.before_optimizer_step()
        self.response.upload_completion.result()

    def close(self):
        self.finish()
        self.stager.close()


def run_steps(rank, model, saver):
    """The loop's steps, saving on `save_steps` when `saver` is given; returns each step's time
    (the slowest rank's)."""
    options = rank.options
    save_steps = set(range(options["save_every"], options["steps"] - 1, options["save_every"]))
    times = []
    dist.barrier()
    for step in range(options["steps"]):
        start = time.perf_counter()
        model.compute()
        if saver is not None:
            saver.before_optimizer_step()
        model.optimizer.step()
        if saver is not None and step in save_steps:
            saver.save(step)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist(), sorted(save_steps)


def training_loop(rank):
    """The loop without saves (before and after the others), with zerowait's save() and with
    dcp.async_save every N steps; the memcpy of the loop's state beside them."""
    model = Model(rank)
    model.compute()
    model.optimizer.step()  # AdamW's state exists from here
    copy = StateCopy(model.state())
    memcpy = min(wall(copy.copy) for _ in range(3))
    copy.close()
    result = {"state_bytes": state_bytes(model.state()), "memcpy_s": memcpy, "runs": {}}
    for name in ("none", "zerowait", "dcp_async", "none_after"):
        rank.log(f"training loop: saves by {name}")
        saver = {"zerowait": ZerowaitSaver, "dcp_async": DcpSaver}.get(name)
        saver = saver(rank, model) if saver else None
        times, save_steps = run_steps(rank, model, saver)
        if saver is not None:
            saver.close()
        result["runs"][name] = {"step_s": times, "save_steps": save_steps}
    for path in rank.out.glob("loop-*"):
        rank.remove(path)
    baseline = result["runs"]["none"]["step_s"] + result["runs"]["none_after"]["step_s"]
    result["baseline_step_s"] = statistics.median(baseline)
    return result


def save_phase(rank):
    state = synthetic_state(rank.shapes, rank.mesh)
    report = {"world_size": rank.world, "state_bytes": state_bytes(state),
              "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    rank.log("zerowait saves")
    report["zerowait"] = zerowait_saves(rank, state)
    rank.log("dcp.save")
    report["dcp_save"] = dcp_saves(rank, state)
    rank.log("dcp.async_save, thread-based, DefaultStager")
    report["dcp_async_thread"] = dcp_async_saves(rank, state, process=False)
    if not rank.options["no_process"]:
        rank.log("dcp.async_save, process-based, DefaultStager in shared memory")
        report["dcp_async_process"] = dcp_async_saves(rank, state, process=True)
    del state
    report["loop"] = training_loop(rank)
    return report


# ---- 3. resharded restores --------------------------------------------------------------------

def evict(rank, folders):
    """Evicts the files of `folders` from the page cache (rank 0, the others waiting)."""
    dist.barrier()
    if rank.rank == 0:
        paths = [str(p) for folder in folders for p in folder.rglob("*") if p.is_file()]
        os.sync()
        zerowait._core.evict_from_page_cache(paths)
    dist.barrier()


def read_through(rank, folders):
    """Reads the files of `folders` once (rank 0), so that the page cache holds them."""
    dist.barrier()
    if rank.rank == 0:
        for path in (p for folder in folders for p in folder.rglob("*") if p.is_file()):
            with open(path, "rb") as f:
                while f.read(16 << 20):
                    pass
    dist.barrier()


def restore_phase(rank):
    """zerowait load(into=) and dcp.load of the same state, saved by 4 ranks, into the same
    2-rank targets, cold and warm; each result checked bit for bit on every rank."""
    targets = synthetic_state(rank.shapes, rank.mesh, zeros=True)
    ckpt = zerowait.Checkpointer(rank.out / ZEROWAIT_DIR)
    # The same, reading through the page cache (what a warm cache can serve) instead of O_DIRECT.
    buffered = zerowait.Checkpointer(rank.out / ZEROWAIT_DIR, direct_reads=False)
    step = ckpt.latest()
    folders = [rank.out / ZEROWAIT_DIR, rank.out / DCP_DIR]
    loads = {"zerowait": lambda: ckpt.load(step, into=targets),
             "zerowait_buffered": lambda: buffered.load(step, into=targets),
             "dcp": lambda: dcp.load(targets, checkpoint_id=rank.out / DCP_DIR)}
    report = {"world_size": rank.world, "state_bytes": state_bytes(targets), "loads": {},
              "wrong": {}}
    for _ in range(rank.options["repeat"]):
        for cache in ("cold", "warm"):
            for name, load in loads.items():
                zero_(targets)
                if cache == "cold":
                    evict(rank, folders)
                else:
                    read_through(rank, folders)
                rank.log(f"{cache} restore by {name}")
                seconds, _ = timed(load)
                key = f"{name}_{cache}"
                report["loads"][key] = min(seconds, report["loads"].get(key, seconds))
                wrong = mismatches(targets, rank.shapes, rank.mesh)
                every = [None] * rank.world
                dist.all_gather_object(every, wrong)
                report["wrong"][key] = sorted({w for part in every for w in part})
    ckpt.close()
    buffered.close()
    return report


def main():
    phase, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    torch.set_num_threads(1)  # one intra-op thread a rank, as torchrun sets OMP_NUM_THREADS=1
    rank = Rank(out, options)
    report = save_phase(rank) if phase == "save" else restore_phase(rank)
    if rank.rank == 0:
        (rank.out / f"{phase}.json").write_text(json.dumps(report, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":  # DCP's saving process imports this module again (spawn)
    main()
