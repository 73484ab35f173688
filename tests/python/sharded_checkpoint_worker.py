"""One rank of the sharded checkpoint tests; run by test_sharded_checkpoint.py as a real process.

    sharded_checkpoint_worker.py MODE DIRECTORY OUT_DIR     (RANK, WORLD_SIZE, MASTER_* in env)

MODE "save": a 1-D mesh over every rank; saves step 1 of reference() with Shard(0) (and a
Replicate tensor). "save-hsdp": a 2x2 mesh (replicate, shard), HSDP's placement [Replicate,
Shard(0)]. "load": restores step 1 onto 1-D meshes with Shard(0), Shard(1) and Replicate (and
with four ranks a 2x2 mesh [Shard(0), Shard(1)]), each compared bit for bit with reference().
"load-damaged": restores step 1 with Shard(0) and reports the error, if any. "kill": every rank
saves step 1; then rank 1 dies (SIGKILL) and rank 0 reports what its save of step 2 raised.
"save-export": step 1 of reference() with Shard(0), reference()["w"] again with Shard(1) (as
"/tp/w1"), and per-rank tensors that differ by rank ("/head/bias", "/head/flags"), for
`zerowait ckpt export`. "fsdp": save_fsdp(). "sharded-tensor": save_and_load_sharded_tensor().
"background-copy": background_copy(). Each rank writes what it saw to OUT_DIR/rank-<r>.json.
"""

import json
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import zerowait

PIECE_BYTES = 64  # small pieces, so that a resharding read covers some of a chunk's pieces


def reference() -> dict:
    """The full tensors every test saves: odd sizes (uneven shards), several dtypes."""
    g = torch.Generator().manual_seed(29)
    return {"w": torch.randn(11, 6, generator=g),
            "b": torch.randn(5, generator=g).to(torch.bfloat16),
            "ids": torch.randint(0, 1 << 40, (9, 3), generator=g),
            "rep": torch.randn(4, 3, generator=g, dtype=torch.float64)}


def per_rank_tensors(rank: int) -> dict:
    """Plain tensors each rank saves in its own part (save-export)."""
    return {"bias": torch.arange(7, dtype=torch.float32) / 3 + rank,
            "flags": torch.tensor([True, False, bool(rank)])}


def placed(mesh, placements, targets=False) -> dict:
    """reference() distributed over `mesh` (Shard/Replicate as given; "rep" is Replicate on
    every mesh dimension); with `targets`, zero tensors of that placement to load into."""
    out = {}
    for name, full in reference().items():
        where = [Replicate()] * mesh.ndim if name == "rep" else placements
        if name == "b" and any(isinstance(p, Shard) and p.dim == 1 for p in where):
            where = [Shard(0)] * mesh.ndim  # 1-D: no dimension 1
        out[name] = distribute_tensor(torch.zeros_like(full) if targets else full, mesh, where)
    return out


def equal_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def check(loaded: dict, targets: dict) -> dict:
    """Compares this rank's shard of each loaded tensor with the same slice of reference()."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    report = {}
    for name, full in reference().items():
        got = loaded["model"][name]
        assert got is targets[name], name  # filled in place
        sizes, offsets = compute_local_shape_and_global_offset(got.shape, got.device_mesh,
                                                               got.placements)
        expected = full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
        report[name] = equal_bits(got.to_local(), expected)
    return report


def save_fsdp(ckpt, out: str, rank: int) -> None:
    """FSDP2: a small model sharded with fully_shard, one Adam step, saved as step 1; rank 0
    writes the full parameters and optimizer state to OUT_DIR/reference.pt."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    ckpt.save(1, state, blocking=True)

    def full(value):
        if isinstance(value, dict):
            return {k: full(v) for k, v in value.items()}
        if isinstance(value, list):
            return [full(v) for v in value]
        return value.full_tensor() if isinstance(value, DTensor) else value

    reference_state = full(state)  # collective: every rank
    if rank == 0:
        torch.save(reference_state, os.path.join(out, "reference.pt"))


def sharded_tensor(full: torch.Tensor, rows: list, rank: int):
    """A ShardedTensor of `full` split by rows at `rows` (one shard a rank), this rank's shard
    holding `full`'s rows."""
    from torch.distributed._shard.sharded_tensor import Shard as LocalShard
    from torch.distributed._shard.sharded_tensor import ShardMetadata, init_from_local_shards

    start, end = rows[rank], rows[rank + 1]
    metadata = ShardMetadata(shard_offsets=[start, 0], shard_sizes=[end - start, full.shape[1]],
                             placement=f"rank:{rank}/cpu")
    return init_from_local_shards([LocalShard(full[start:end].clone(), metadata)], *full.shape)


def save_and_load_sharded_tensor(ckpt, rank: int, world: int) -> dict:
    """Saves "w" as a ShardedTensor split 6/5 by rows, then loads it into one split 4/7."""
    full = reference()["w"]
    ckpt.save(1, {"model": {"w": sharded_tensor(full, [0, 6, 11], rank)}}, blocking=True)
    target = sharded_tensor(torch.zeros_like(full), [0, 4, 11], rank)
    loaded = ckpt.load(1, into={"model": {"w": target}})["model"]["w"]
    shard = target.local_shards()[0]
    start = shard.metadata.shard_offsets[0]
    return {"same_object": loaded is target,
            "equal": equal_bits(shard.tensor, full[start:start + shard.tensor.shape[0]])}


def background_copy(ckpt, world: int) -> dict:
    """DTensor parameters an optimizer owns, saved while the engine holds their copy back
    ($ZEROWAIT_FAULT_COPY_STALL_MS): save() returns before any piece is copied, the optimizer
    step right after it waits for the copy of every piece (the step holds the values before
    it), and an in-place edit outside a step fails the next save, naming a piece."""
    mesh = init_device_mesh("cpu", (world,))
    start = placed(mesh, [Shard(0)])
    params = {name: torch.nn.Parameter(start[name]) for name in ("w", "b")}
    optimizer = torch.optim.SGD(params.values(), lr=0.5)
    for p in params.values():
        p.grad = torch.ones_like(p)
    optimizer.step()  # the Checkpointer knows the optimizer from its first step
    before = {name: p.detach().to_local().clone() for name, p in params.items()}
    os.environ["ZEROWAIT_FAULT_COPY_STALL_MS"] = "1500"
    state = {"model": {name: p.detach() for name, p in params.items()}}
    handle = ckpt.save(1, state)
    report = {"copied_at_return": handle.copied()}
    optimizer.step()  # changes every element of every piece
    report["save"] = handle.wait()
    report["changed_by_step"] = all(not torch.equal(p.detach().to_local(), before[name])
                                    for name, p in params.items())
    targets = {name: distribute_tensor(torch.zeros_like(reference()[name]), mesh, [Shard(0)])
               for name in params}
    loaded = ckpt.load(1, into={"model": targets})
    report["holds_values_before_step"] = all(
        equal_bits(loaded["model"][name].to_local(), before[name]) for name in params)
    handle = ckpt.save(2, {"model": {name: p.detach() for name, p in params.items()}})
    with torch.no_grad():
        params["w"].mul_(2.0)  # not an optimizer step: nothing waits for the copy
    try:
        handle.wait()
        report["edit"] = "committed"
    except zerowait.CancelledError as error:
        report["edit"] = str(error)
    return report


def main() -> None:
    mode, directory, out = sys.argv[1], sys.argv[2], sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Four ranks on two busy cores can be a minute apart; a dead rank is caught by the
    # Checkpointer's own commit_timeout, not by this.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=180))
    report = {"rank": rank}
    ckpt = zerowait.Checkpointer(directory, piece_bytes=PIECE_BYTES, commit_timeout=60)
    if mode in ("save", "save-hsdp", "kill"):
        if mode == "save-hsdp":
            mesh, placements = init_device_mesh("cpu", (2, world // 2)), [Replicate(), Shard(0)]
        else:
            mesh, placements = init_device_mesh("cpu", (world,)), [Shard(0)]
        state = {"model": placed(mesh, placements), "step": 1, "rank_value": rank * 10}
        report["save"] = ckpt.save(1, state, blocking=True).wait()
        if mode == "kill":
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # before any part of step 2 exists
            try:
                ckpt.save(2, state, blocking=True)
                report["step2"] = "committed"
            except Exception as error:  # noqa: BLE001 - what the test checks
                report["step2"] = f"{type(error).__name__}: {error}"
    elif mode == "save-export":
        mesh = init_device_mesh("cpu", (world,))
        state = {"model": placed(mesh, [Shard(0)]),
                 "tp": {"w1": distribute_tensor(reference()["w"], mesh, [Shard(1)])},
                 "head": per_rank_tensors(rank), "step": 1}
        report["save"] = ckpt.save(1, state, blocking=True).wait()
    elif mode == "background-copy":
        report.update(background_copy(ckpt, world))
    elif mode == "fsdp":
        save_fsdp(ckpt, out, rank)
    elif mode == "sharded-tensor":
        report.update(save_and_load_sharded_tensor(ckpt, rank, world))
    elif mode == "load":
        layouts = [("shard0", (world,), [Shard(0)]), ("shard1", (world,), [Shard(1)]),
                   ("replicate", (world,), [Replicate()])]
        if world == 4:
            layouts.append(("2d", (2, 2), [Shard(0), Shard(1)]))
        for label, shape, placements in layouts:
            targets = placed(init_device_mesh("cpu", shape), placements, targets=True)
            loaded = ckpt.load(1, into={"model": targets})
            report[label] = check(loaded, targets)
            report["rank_value"] = loaded["rank_value"]
    elif mode == "load-damaged":
        targets = placed(init_device_mesh("cpu", (world,)), [Shard(0)], targets=True)
        try:
            report["shard0"] = check(ckpt.load(1, into={"model": targets}), targets)
        except zerowait.CorruptDataError as error:
            report["error"] = str(error)
    ckpt.close()
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
