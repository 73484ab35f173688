"""The ``--halving`` test of ``zerowait bench net``: a DDP model with emulated compute, its
input pipelines, the step time of the three variants (configured, input removed, all-reduce
removed) and the verdict on what bounds the step (bench_net.py's docstring has the method and
the JSON shape)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

from . import _core

HALVING_THRESHOLD = 0.10  # a change in step time below this is noise, not a bound
_WARMUP_STEPS = 3


# Also used by bench_net.py, which imports this module (never the other way round).
class BenchError(Exception):
    """A failure the user can fix; printed as one line."""


def max_over_ranks(value: float, group: Any) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _sleep_layer_class() -> Any:
    import torch

    class EmulatedCompute(torch.autograd.Function):
        """Sleeps `seconds` in forward and twice that in backward (a backward costs about two
        forwards), standing for GPU work between two layers."""

        @staticmethod
        def forward(ctx: Any, x: Any, seconds: float) -> Any:
            ctx.seconds = seconds
            time.sleep(seconds)
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            time.sleep(2 * ctx.seconds)
            return grad, None

    return EmulatedCompute


def build_model(grad_bytes: int, compute_ms: float, device: Any) -> Any:
    """Square bias-free linear layers holding about `grad_bytes` of float32 parameters, with
    `compute_ms` of emulated compute spread between them."""
    import torch

    width = max(16, min(1024, math.isqrt(max(1, grad_bytes // 4))))
    layers = max(1, round(grad_bytes / (4 * width * width)))
    compute = _sleep_layer_class()
    per_layer = compute_ms / 1e3 / 3 / layers

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(width, width, bias=False) for _ in range(layers))

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                x = layer(x)
                if per_layer > 0:
                    x = compute.apply(x, per_layer)
            return x

    return Model().to(device), width


class SyntheticSamples:
    """`length` samples of 1 KiB that each cost `seconds` (a read or a decode on its own
    core: a sleep, so the cost does not depend on how busy this machine is)."""

    def __init__(self, length: int, seconds: float) -> None:
        self.length, self.seconds = length, seconds

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        import torch

        if self.seconds > 0:
            time.sleep(self.seconds)
        return torch.full((256,), float(index))


class FileSamples:
    """The bytes of each file, as torch DataLoader users read a directory of samples."""

    def __init__(self, paths: List[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Any:
        import torch

        with open(self.paths[index], "rb") as f:
            return torch.frombuffer(bytearray(f.read()) or bytearray(1), dtype=torch.uint8)


def collate_list(samples: List[Any]) -> List[Any]:
    return samples


def is_zerowait_dataset(path: Path) -> bool:
    return ((path / "manifest.json").is_file() or path.suffix in (".zws", ".tar")
            or any(path.glob("*.zws")) or any(path.glob("*.tar")))


def input_pipeline(args: argparse.Namespace, rank: int,
                   world: int) -> tuple[str, Callable[[], Any]]:
    """(kind, a function returning a fresh iterable of batches) for the configured input."""
    import torch.utils.data as tud

    total = args.batch_size * world * (args.steps + _WARMUP_STEPS)
    if args.data is None:
        dataset: Any = SyntheticSamples(total, args.sample_ms / 1e3)
        kind = "synthetic"
    elif is_zerowait_dataset(Path(args.data)):
        import zerowait

        def make_loader() -> Any:
            return zerowait.Loader(args.data, args.batch_size, shuffle="random", rank=rank,
                                   world_size=world, threads=args.workers or None)
        return "zerowait", make_loader
    elif Path(args.data).is_dir():
        paths = sorted(str(p) for p in Path(args.data).rglob("*") if p.is_file())
        if len(paths) < world:
            raise BenchError(f"--data {args.data} holds {len(paths)} files, fewer than the "
                             f"{world} ranks; point it at the training data")
        dataset, kind = FileSamples(paths), "files"
    else:
        raise BenchError(f"--data {args.data} is neither a zerowait dataset nor a directory")

    def make_dataloader() -> Any:
        sampler = tud.DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0)
        return tud.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                              num_workers=args.workers, collate_fn=collate_list,
                              timeout=args.timeout if args.workers else 0)
    return kind, make_dataloader


def endless(make: Callable[[], Any]) -> Iterator[Any]:
    """Batches across as many epochs as asked for; the iterable is closed when the caller
    closes this generator."""
    while True:
        source = make()
        try:
            empty = True
            for batch in source:
                empty = False
                yield batch
            if empty:
                raise BenchError("the --halving input yields no batch; check --data and "
                                 "--batch-size")
        finally:
            if hasattr(source, "close"):
                source.close()


def available_memory(device: Any) -> int:
    """Bytes this rank may still allocate: free GPU memory, or MemAvailable shared by the
    host's ranks."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    available = (_core.available_memory_bytes()
                 or os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return available // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def run_halving(args: argparse.Namespace, rank: int, world: int, device: Any,
                control: Any) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    # At most an eighth of the memory available to each rank: gradients, DDP's buckets and
    # the other ranks on this host come on top of the parameters.
    model_bytes = max(4096, min(args.grad_bytes, available_memory(device) // 8))
    model, width = build_model(model_bytes, args.compute_ms, device)
    model_bytes = sum(p.numel() * 4 for p in model.parameters())
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                  gradient_as_bucket_view=True)
    x = torch.randn(args.batch_size, width, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(batch: Any, allreduce: bool) -> None:
        if batch is not None:  # what a training step does with its input: put it on the device
            for t in batch if isinstance(batch, list) else batch.values():
                if isinstance(t, torch.Tensor):
                    t.to(device, non_blocking=True)
        with contextlib.nullcontext() if allreduce else ddp.no_sync():
            ddp(x).square().mean().backward()
        # Reused gradient buffers: set_to_none would fault fresh pages in every step.
        ddp.zero_grad(set_to_none=False)
        sync()

    kind, make = input_pipeline(args, rank, world)

    def timed(with_input: bool, allreduce: bool) -> float:
        batches = endless(make) if with_input else None
        try:
            for _ in range(_WARMUP_STEPS):
                step(next(batches) if batches else None, allreduce)
            dist.barrier(group=control)
            start = time.perf_counter()
            for _ in range(args.steps):
                step(next(batches) if batches else None, allreduce)
            return max_over_ranks(time.perf_counter() - start, control) / args.steps
        finally:
            if batches:
                batches.close()

    seconds = {"configured": timed(True, True), "input_removed": timed(False, True),
               "allreduce_removed": timed(True, False)}
    base = seconds["configured"]
    gain = {k: (base - seconds[k]) / base for k in ("input_removed", "allreduce_removed")}
    verdict, reason = halving_verdict(gain)
    return {"input": kind, "steps": args.steps, "batch_size": args.batch_size,
            "workers": args.workers, "sample_ms": args.sample_ms if kind == "synthetic" else None,
            "compute_ms": args.compute_ms, "grad_bytes": args.grad_bytes,
            "model_bytes": model_bytes, "step_seconds": seconds, "gain": gain,
            "threshold": HALVING_THRESHOLD, "verdict": verdict, "reason": reason}


def halving_verdict(gain: Dict[str, float]) -> tuple[str, str]:
    """What bounds the step, from how much removing each part shortened it."""
    name = {"input_removed": "the input", "allreduce_removed": "the all-reduce"}
    best = max(gain, key=lambda k: gain[k])
    if gain[best] <= HALVING_THRESHOLD:
        return "compute-bound", (f"removing the input or the all-reduce changes the step by at "
                                 f"most {gain[best]:.0%} (threshold {HALVING_THRESHOLD:.0%})")
    verdict = "input-bound" if best == "input_removed" else "communication-bound"
    return verdict, f"removing {name[best]} shortens the step by {gain[best]:.0%}"
