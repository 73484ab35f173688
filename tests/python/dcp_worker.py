"""One rank of the torch.distributed.checkpoint tests; run by test_dcp.py as a real process.

    dcp_worker.py MODE DIRECTORY OUT_DIR     (RANK, WORLD_SIZE, MASTER_* in env)

MODE "save": an FSDP2 model (fully_shard over every rank) and its Adam state saved through
zerowait.dcp.Writer: step 0 with dcp.save, steps 1 and 2 with dcp.async_save in thread and in
process mode (save()). "load": builds the model sharded over this job's ranks (whole tensors on
one rank), loads the newest step with dcp.load through zerowait.dcp.Reader and set_state_dict,
and rank 0 reports where the full state differs from OUT_DIR/reference-2.pt. "kill": saves
step 0, then rank 1 dies (SIGKILL) once its part of step 1 is durable, before the coordinator
could commit; rank 0 reports what dcp.save raised.
Each rank writes what it saw to OUT_DIR/rank-<r>.json.
"""

import json
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import zerowait.dcp

PIECE_BYTES = 64  # small pieces, so that resharding reads cover parts of chunks


def make_model(shard: bool):
    """A small model (odd sizes: uneven shards on 2 and 3 ranks) and its Adam optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 11), torch.nn.ReLU(), torch.nn.Linear(11, 5))
    if shard:
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train_step(model, optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    model(torch.randn(4, 7, generator=g)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def full_state(model, optimizer) -> dict:
    """The whole model and optimizer state as plain CPU tensors (a collective when sharded)."""
    model_sd, optim_sd = get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": model_sd, "optim": optim_sd}


def differences(a, b, where="state") -> list:
    """Key paths where `a` and `b` differ (tensors bit for bit)."""
    if isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"]
        return [d for k in b for d in differences(a[k], b[k], f"{where}[{k!r}]")]
    if isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    if isinstance(b, torch.Tensor):
        a = a.full_tensor() if isinstance(a, DTensor) else a
        same = (a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8)))
        return [] if same else [where]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def save(directory: str, out: str, rank: int) -> dict:
    """Step 0 through dcp.save (its number chosen by the Writer), steps 1 and 2 through
    dcp.async_save in thread and process mode (named by checkpoint_id), a training step between
    each; rank 0 writes the full state each step saved to OUT_DIR/reference-<step>.pt."""
    model, optimizer = make_model(shard=True)
    writer = zerowait.dcp.Writer(directory, piece_bytes=PIECE_BYTES)
    # The saves' collectives run beside the training steps': a group of their own, as DCP asks.
    group = dist.new_group(backend="gloo")
    report = {}
    for step, kind in enumerate((None, AsyncCheckpointerType.THREAD,
                                 AsyncCheckpointerType.PROCESS)):
        train_step(model, optimizer, step)
        reference = full_state(model, optimizer)
        if rank == 0:
            torch.save(reference, os.path.join(out, f"reference-{step}.pt"))
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "extra": {"epoch": step}}
        if kind is None:
            dcp.save(state, storage_writer=writer)
            report["step0"] = writer.saved_step
            continue
        pending = dcp.async_save(state, storage_writer=writer, process_group=group,
                                 checkpoint_id=f"{directory}/step-{step}",
                                 async_checkpointer_type=kind)
        train_step(model, optimizer, 10 + step)  # in place: the staged copy is what is saved
        pending.result()
        report[f"step{step}"] = kind.value
    writer.close()
    return report


def load(directory: str, world: int) -> dict:
    model, optimizer = make_model(shard=world > 1)
    model_sd, optim_sd = get_state_dict(model, optimizer)  # initialises Adam's state
    state = {"model": model_sd, "optim": optim_sd, "extra": {"epoch": -1}}
    reader = zerowait.dcp.Reader(directory)
    dcp.load(state, storage_reader=reader)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return {"step": reader.loaded_step, "epoch": state["extra"]["epoch"],
            "full": full_state(model, optimizer)}


class DyingWriter(zerowait.dcp.Writer):
    """Dies (SIGKILL) once this rank's part is durable: before any rank learns of it."""

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        os.kill(os.getpid(), signal.SIGKILL)
        return written


def kill(directory: str, rank: int) -> dict:
    model, optimizer = make_model(shard=True)
    train_step(model, optimizer, 1)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "extra": {"epoch": 0}},
             storage_writer=zerowait.dcp.Writer(directory, piece_bytes=PIECE_BYTES))
    writer_type = DyingWriter if rank == 1 else zerowait.dcp.Writer
    try:
        dcp.save({"model": model_sd, "optim": optim_sd, "extra": {"epoch": 1}},
                 storage_writer=writer_type(directory, piece_bytes=PIECE_BYTES))
        return {"step1": "committed"}
    except BaseException as error:  # noqa: BLE001 - CheckpointException is a BaseException
        return {"step1": f"{type(error).__name__}: {error}"}


def main() -> None:
    mode, directory, out = sys.argv[1], sys.argv[2], sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Four ranks on two busy cores can be a minute apart; a dead rank is caught by the
    # Checkpointer's own commit_timeout, not by this.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=180))
    if mode == "save":
        report = save(directory, out, rank)
    elif mode == "load":
        loaded = load(directory, world)
        reference = torch.load(os.path.join(out, "reference-2.pt"))
        report = {"step": loaded["step"], "epoch": loaded["epoch"],
                  "differences": differences(loaded["full"], reference)}
    elif mode == "kill":
        report = kill(directory, rank)
    report["rank"] = rank
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
