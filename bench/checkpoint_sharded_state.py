"""The sharded training state of the sharded checkpoint benchmark (checkpoint_sharded.py): DTensor
parameters Shard(0) over a 1-D mesh, AdamW-shaped optimizer state, values any rank can recompute
for any box of a tensor (so a resharded restore is checked bit for bit), and the memcpy reference.

Imported by checkpoint_sharded_worker.py in each rank's process.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

COLUMNS = 2048
LAYERS = 8
# Three fp32 tensors per parameter: the weights and AdamW's two moments.
COPIES_PER_PARAMETER = 3


def layer_shapes(total_bytes):
    """(name, global shape) of each parameter: LAYERS weight matrices of COLUMNS columns and
    1, 2, 3 or 4 row units (so the shards are of different sizes, some uneven over the ranks),
    each with a bias, about `total_bytes` in all with the two moments."""
    units = [1 + i % 4 for i in range(LAYERS)]
    floats = total_bytes / (4 * COPIES_PER_PARAMETER)
    rows_per_unit = max(2, int(floats / ((COLUMNS + 1) * sum(units))))
    shapes = []
    for i, unit in enumerate(units):
        rows = unit * rows_per_unit + (i % 3)  # + 0..2: uneven over 2 and 4 ranks
        shapes.append((f"layers.{i}.weight", (rows, COLUMNS)))
        shapes.append((f"layers.{i}.bias", (rows,)))
    return shapes


def box_values(shape, offsets, sizes, salt):
    """The values of the box (`offsets`, `sizes`) of a tensor of global `shape`: a function of
    the global row and column (and `salt`), so every rank computes any box without the rest."""
    rows = torch.arange(offsets[0], offsets[0] + sizes[0], dtype=torch.int64)
    row_part = ((rows * 2654435761 + salt * 97) % 1000003).to(torch.float32) * 1e-6
    if len(shape) == 1:
        return row_part
    cols = torch.arange(offsets[1], offsets[1] + sizes[1], dtype=torch.int64)
    col_part = ((cols * 40503 + salt) % 997).to(torch.float32) * 1e-3
    return row_part.unsqueeze(1) + col_part  # one pass into the new tensor


def local_box(shape, mesh):
    """(sizes, offsets) of this rank's Shard(0) chunk of a tensor of global `shape`."""
    sizes, offsets = compute_local_shape_and_global_offset(torch.Size(shape), mesh, [Shard(0)])
    return sizes, offsets


def sharded(shape, mesh, salt, zeros=False):
    """A DTensor of global `shape`, Shard(0) over `mesh`, holding box_values (or zeros)."""
    sizes, offsets = local_box(shape, mesh)
    local = torch.zeros(sizes) if zeros else box_values(shape, offsets, sizes, salt)
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                              shape=torch.Size(shape), stride=stride)


def salts(index):
    """The salts of parameter `index`'s weights, exp_avg and exp_avg_sq."""
    return 3 * index + 1, 3 * index + 2, 3 * index + 3


def synthetic_state(shapes, mesh, zeros=False):
    """{"model": {name: DTensor}, "optim": {"state": {name: {"step", "exp_avg", "exp_avg_sq"}},
    "param_groups": [...]}}: what a user saves of an FSDP2 model and its AdamW, keyed by the
    parameters' names (as torch.distributed.checkpoint.state_dict.get_state_dict gives them).
    With `zeros`, the same structure filled with zeros: the targets of a restore."""
    model, moments = {}, {}
    for index, (name, shape) in enumerate(shapes):
        weights, avg, avg_sq = salts(index)
        model[name] = sharded(shape, mesh, weights, zeros)
        moments[name] = {"step": torch.tensor(0.0 if zeros else 10.0),
                         "exp_avg": sharded(shape, mesh, avg, zeros),
                         "exp_avg_sq": sharded(shape, mesh, avg_sq, zeros)}
    groups = [{"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
               "params": [name for name, _ in shapes]}]
    return {"model": model, "optim": {"state": moments, "param_groups": groups}}


def mismatches(state, shapes, mesh):
    """Names of the tensors of `state` (as synthetic_state made it, then restored into) whose
    local part differs from the values synthetic_state saved; empty when the restore is exact."""
    wrong = []
    for index, (name, shape) in enumerate(shapes):
        weights, avg, avg_sq = salts(index)
        moments = state["optim"]["state"][name]
        sizes, offsets = local_box(shape, mesh)
        for key, tensor, salt in (("model", state["model"][name], weights),
                                  ("exp_avg", moments["exp_avg"], avg),
                                  ("exp_avg_sq", moments["exp_avg_sq"], avg_sq)):
            if not torch.equal(tensor.to_local(), box_values(shape, offsets, sizes, salt)):
                wrong.append(f"{key}/{name}")
        if moments["step"].item() != 10.0:
            wrong.append(f"step/{name}")
    return wrong


def zero_(state):
    """Fills every tensor of a state with zeros (targets before each restore)."""
    for value in local_tensors(state):
        value.zero_()


def local_tensors(state, plain=True):
    """Every tensor of a nested state as this rank holds it (a DTensor's local part); plain
    tensors only with `plain`."""
    if isinstance(state, DTensor):
        yield state.to_local()
    elif isinstance(state, torch.Tensor):
        if plain:
            yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from local_tensors(value, plain)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from local_tensors(value, plain)


def state_bytes(state):
    """Bytes of `state` over every rank: each rank's parts of its DTensors, plain tensors (which
    every rank holds) once."""
    tensors = local_tensors(state, plain=dist.get_rank() == 0)
    total = torch.tensor([sum(t.numel() * t.element_size() for t in tensors)], dtype=torch.int64)
    dist.all_reduce(total)
    return int(total.item())


class StateCopy:
    """The memcpy reference: each rank copies its local tensors with copy_ into one buffer that
    was allocated and touched beforehand (no first-touch page faults while timing)."""

    def __init__(self, state):
        self.sources = [t.detach().reshape(-1).view(torch.uint8) for t in local_tensors(state)]
        self.buffer = torch.ones(sum(s.numel() for s in self.sources), dtype=torch.uint8)

    def copy(self):
        offset = 0
        for source in self.sources:
            self.buffer[offset:offset + source.numel()].copy_(source)
            offset += source.numel()

    def close(self):
        self.sources, self.buffer = [], None


def max_over_ranks(value, group=None):
    """The largest of every rank's float `value`."""
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return float(tensor.item())


def timed(fn):
    """fn() on every rank at once (a barrier first): (seconds of the slowest rank, fn's value)."""
    dist.barrier()
    start = time.perf_counter()
    value = fn()
    return max_over_ranks(time.perf_counter() - start), value


def wall(fn):
    """Seconds from the moment every rank starts fn() until every rank has finished it (the
    barriers' own latency included): what the ranks doing fn() together cost the machine, where
    the slowest rank's own time would leave out ranks that ran one after another."""
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return max_over_ranks(time.perf_counter() - start)
