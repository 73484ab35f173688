"""One rank of the FSDP2 train/kill/resume proof; run by test_fsdp_resume.py as a real process.

    fsdp_train_worker.py MODE DIRECTORY OUT_DIR     (RANK, WORLD_SIZE, MASTER_* in env)

MODE "train" (4 ranks): FSDP2 (fully_shard over every rank) trains a small transformer for
STEPS steps, saving model and optimizer state through zerowait.Checkpointer every SAVE_EVERY
steps, and writes every step's loss plus, at each saved step, the full (gathered) parameters and
optimizer state (rank 0: OUT_DIR/full-step-<N>.pt). Then it starts an asynchronous save of the
last step and every rank dies by SIGKILL, mid-save: nothing is closed, nothing flushed.
MODE "resume-fsdp" (any world size): restores step RESUME_STEP onto FSDP2 over the ranks it has.
MODE "resume-2d" (4 ranks): restores step RESUME_STEP twice: onto FSDP2 over 4 ranks (the saving
placement), then onto a 2x2 mesh, tensor parallel (colwise/rowwise projections) on one dimension
and fully_shard on the other. After each restore: the full state gathered (rank 0:
OUT_DIR/restored-<placement>.pt), then training goes on to STEPS, each loss recorded.
Each rank writes its report (losses by step) to OUT_DIR/<placement>-rank-<r>.json.

Deterministic: fixed seeds, torch.use_deterministic_algorithms, one thread, and each step's
global batch is a function of the step alone; every data-parallel rank takes its rows of it.
"""

import json
import os
import signal
import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import zerowait

VOCAB, D_MODEL, HEADS, LAYERS, SEQ, GLOBAL_BATCH = 64, 64, 4, 2, 16, 8
STEPS, SAVE_EVERY, RESUME_STEP = 8, 2, 4
PIECE_BYTES = 4096  # several pieces a chunk, so that resharding reads parts of chunks


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.q, self.k, self.v, self.o = (nn.Linear(D_MODEL, D_MODEL) for _ in range(4))
        self.up, self.down = nn.Linear(D_MODEL, 2 * D_MODEL), nn.Linear(2 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        batch, seq, _ = h.shape
        # Heads from the local width: tensor parallelism leaves a rank HEADS / tp of them.
        q, k, v = (p(h).view(batch, seq, -1, D_MODEL // HEADS).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, seq, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batch(step: int) -> torch.Tensor:
    """The global batch of `step`: the same on every rank and in every run. Each sequence follows
    a fixed rule from a random first token, so that the loss has something to learn."""
    g = torch.Generator().manual_seed(1000 + step)
    first = torch.randint(0, VOCAB, (GLOBAL_BATCH, 1), generator=g)
    return (first * 5 ** torch.arange(SEQ + 1) + 3 * torch.arange(SEQ + 1)) % VOCAB


def build(placement: str, world: int):
    """(model, optimizer, data-parallel group, data-parallel rank and size) for "fsdp" (every
    rank one data-parallel shard) or "2d" (a (dp, tp) = (world/2, 2) mesh)."""
    torch.manual_seed(0)  # the same initial weights whatever the placement
    model = Transformer()
    if placement == "2d":
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                "o": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], plan)
        dp_mesh = mesh["dp"]
    else:
        dp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer, dp_mesh.get_group(), dp_mesh.get_local_rank(), dp_mesh.size()


def train_step(model, optimizer, step: int, group, dp_rank: int, dp_size: int) -> float:
    """One step on this data-parallel rank's rows of the step's batch; returns the global mean
    loss (every data-parallel rank's loss, summed over the group, divided by their number)."""
    rows = GLOBAL_BATCH // dp_size
    tokens = batch(step)[dp_rank * rows:(dp_rank + 1) * rows]
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    return (total / dp_size).item()


def sharded_state(model, optimizer) -> dict:
    """What is saved and restored: DTensors in the placement the model has, keyed by name."""
    return {"model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer)}


def write_full_state(model, optimizer, path: str) -> None:
    """Gathers the whole model and optimizer state (collective); rank 0 writes it to `path`."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = {"model": get_model_state_dict(model, options=options),
            "optim": get_optimizer_state_dict(model, optimizer, options=options)}
    if dist.get_rank() == 0:
        torch.save(full, path)


def write_report(out: str, placement: str, report: dict) -> None:
    with open(os.path.join(out, f"{placement}-rank-{dist.get_rank()}.json"), "w") as f:
        json.dump(report, f)


def train(directory: str, out: str, world: int) -> None:
    model, optimizer, group, dp_rank, dp_size = build("fsdp", world)
    ckpt = zerowait.Checkpointer(directory, piece_bytes=PIECE_BYTES, commit_timeout=120)
    losses = {}
    for step in range(1, STEPS + 1):
        losses[step] = train_step(model, optimizer, step, group, dp_rank, dp_size)
        if step % SAVE_EVERY == 0 and step < STEPS:
            ckpt.save(step, {**sharded_state(model, optimizer), "step": step})
            write_full_state(model, optimizer, os.path.join(out, f"full-step-{step}.pt"))
    ckpt.wait()  # every save but the last is committed before the kill
    write_report(out, "train", {"losses": losses})
    dist.barrier()
    ckpt.save(STEPS, {**sharded_state(model, optimizer), "step": STEPS})  # in flight at the kill
    os.kill(os.getpid(), signal.SIGKILL)


def resume(directory: str, out: str, world: int, placement: str) -> None:
    model, optimizer, group, dp_rank, dp_size = build(placement, world)
    # Targets in this placement; the optimizer's state is created (zero) by get_optimizer_state_dict
    # so that it has tensors to fill.
    targets = {**sharded_state(model, optimizer), "step": 0}
    ckpt = zerowait.Checkpointer(directory, piece_bytes=PIECE_BYTES, commit_timeout=120)
    loaded = ckpt.load(RESUME_STEP, into=targets)
    set_model_state_dict(model, loaded["model"])
    set_optimizer_state_dict(model, optimizer, loaded["optim"])
    write_full_state(model, optimizer, os.path.join(out, f"restored-{placement}-{world}.pt"))
    losses = {step: train_step(model, optimizer, step, group, dp_rank, dp_size)
              for step in range(loaded["step"] + 1, STEPS + 1)}
    q = model.blocks[0].q.weight  # how the restored model is placed, for the test to check
    write_report(out, f"{placement}-{world}", {
        "loaded_step": ckpt.loaded_step, "step_value": loaded["step"], "losses": losses,
        "mesh": list(q.device_mesh.shape), "placements": [repr(p) for p in q.placements]})
    ckpt.close()


def main() -> None:
    mode, directory, out = sys.argv[1], sys.argv[2], sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    # The model's output is a view that nothing changes in place.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    if mode == "train":
        train(directory, out, world)
    elif mode == "resume-fsdp":
        resume(directory, out, world, "fsdp")
    elif mode == "resume-2d":
        resume(directory, out, world, "fsdp")
        resume(directory, out, world, "2d")
    else:
        raise SystemExit(f"unknown mode {mode}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
