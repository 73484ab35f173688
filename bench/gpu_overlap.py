"""Overlap, measured (bench/run gpu --only overlap): a training loop whose step is a fixed chain
of bf16 matrix products (~20 ms) fed by Loader(device="cuda") at a batch size whose host-to-
device copy takes ~5 ms, against the same chain alone, and against the same loop with the
loader's copies issued on the compute stream instead of a side stream (everything else equal).
Also the copy bandwidth the loader reached against pinned cudaMemcpyAsync of the same bytes
alone (the PCIe limit).

Goals (issue 25): step time within 3 % of compute alone, input wait (next() blocked plus the
compute stream stalled on a copy) at most 1 % of the step, H2D at least 90 % of pinned memcpy.
"""

from __future__ import annotations

import time

import zerowait
from common import ratio

STEP_MS = 20.0  # the compute of one step
COPY_MS = 5.0   # the host-to-device copy of one batch
SAMPLE_BYTES = 4 << 20


def _pinned_h2d_gbps(torch, nbytes, repeats):
    """cudaMemcpyAsync from pinned memory alone, best of `repeats`: the limit."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    host.fill_(1)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = None
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        device.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000
        best = seconds if best is None else min(best, seconds)
    return nbytes / best / 1e9


class _Chain:
    """`matmuls` bf16 4096x4096 products in a row: a step of fixed GPU work."""

    def __init__(self, torch, matmuls):
        self.torch = torch
        self.x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        self.w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
        self.matmuls = matmuls

    def __call__(self, feed=None):
        y = self.x
        if feed is not None:  # the step reads its batch, so its stream must wait for the copy
            y = y + feed[:4096].float().mean().to(y.dtype)
        for _ in range(self.matmuls):
            y = y @ self.w
        return y


def _calibrate(torch, target_ms):
    """Matrix products per step for `target_ms` of compute."""
    chain = _Chain(torch, 20)
    chain()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        chain()
    torch.cuda.synchronize()
    one = (time.perf_counter() - start) / 5 / 20 * 1000
    return max(1, round(target_ms / one))


def _loop(torch, chain, steps, batches=None, sync_every_step=False, on_start=None):
    """Mean seconds per step over `steps` steps after 3 warm-up steps; `on_start` is called
    where the measured steps begin."""
    feed = None
    for i in range(steps + 3):
        if i == 3:
            torch.cuda.synchronize()
            if on_start is not None:
                on_start()
            start = time.perf_counter()
        if batches is not None:
            feed = batches()
        y = chain(feed)
        if sync_every_step:
            y[0, 0].item()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def _write_dataset(path, samples):
    rows = ({"x": bytes([i % 251]) * SAMPLE_BYTES} for i in range(samples))
    zerowait.write_dataset(rows, path, shard_size=256 << 20)


def _endless(loader):
    """Batches for ever: a new epoch starts where the last one ended."""
    iterator = iter(loader)

    def next_batch():
        nonlocal iterator
        for _ in range(2):
            try:
                return next(iterator)["x"]
            except StopIteration:
                iterator = iter(loader)
        raise RuntimeError("the loader delivers no batches")
    return next_batch


def run(args):
    import torch

    full = args.scale == "full"
    steps = 60 if full else 8
    limit = _pinned_h2d_gbps(torch, 256 << 20 if full else 16 << 20, 5)
    batch_bytes = min(int(limit * 1e9 * COPY_MS / 1000), 256 << 20) if full else 8 << 20
    batch = max(1, batch_bytes // SAMPLE_BYTES)
    data = args.work / f"overlap-{batch}"
    if not (data / "manifest.json").exists():
        _write_dataset(data, batch * 4)
    matmuls = _calibrate(torch, STEP_MS if full else 2.0)
    chain = _Chain(torch, matmuls)
    rows, notes = [], []

    compute = _loop(torch, chain, steps)
    rows.append({"loop": "compute alone", "step_ms": compute * 1000, "input_wait_%": 0.0})

    with zerowait.Loader(data, batch_size=batch, device="cuda", drop_last=True) as loader:
        waited = []  # next() and the stream stalled on copies, where the measured steps begin

        def input_wait():
            return loader.wait_s + loader.h2d_wait_s

        fed = _loop(torch, chain, steps, _endless(loader),
                    on_start=lambda: waited.append(input_wait()))
        wait = input_wait() - waited[0]
        h2d = loader.stats()["h2d"]
        threads = loader.stats()["threads"]
    rows.append({"loop": "zerowait Loader(device='cuda')", "step_ms": fed * 1000,
                 "input_wait_%": wait / (fed * steps) * 100})

    with zerowait.Loader(data, batch_size=batch, device="cuda", drop_last=True) as loader:
        # The benchmark reaches in: the same copies, issued on the compute stream.
        loader._copy._stream = torch.cuda.current_stream()
        default_stream = _loop(torch, chain, steps, _endless(loader))
    rows.append({"loop": "zerowait, copies on the compute stream",
                 "step_ms": default_stream * 1000, "input_wait_%": None})

    with zerowait.Loader(data, batch_size=batch, device="cuda", drop_last=True) as loader:
        synced = _loop(torch, chain, steps, _endless(loader), sync_every_step=True)
    rows.append({"loop": "zerowait, loss.item() every step", "step_ms": synced * 1000,
                 "input_wait_%": None})

    reached = h2d["gb_per_s"] or 0.0
    rows.append({"loop": "H2D: loader's copies (GB/s)", "step_ms": None, "gb_per_s": reached})
    rows.append({"loop": "H2D: pinned cudaMemcpyAsync alone (GB/s)", "step_ms": None,
                 "gb_per_s": limit})
    wait_share = rows[1]["input_wait_%"] / 100
    ratios = [
        ratio("step time, zerowait / compute alone", fed / compute, 1.03, False, "g"),
        ratio("input wait share of the step (next() + stream stalled on copy)", wait_share,
              0.01, False, "g"),
        ratio("H2D bandwidth, loader / pinned cudaMemcpyAsync", reached / limit, 0.90, True, "g"),
        ratio("step time, copies on the compute stream / side stream", default_stream / fed,
              1.0, True, "g")]
    notes.append(f"batch {batch} x {SAMPLE_BYTES >> 20} MiB = {batch * SAMPLE_BYTES / 1e6:.0f} MB"
                 f" (a {COPY_MS:.0f} ms copy at the pinned limit), {matmuls} bf16 4096^3 "
                 f"products a step, {steps} steps after 3 warm-up, data in the page cache, "
                 f"{threads} loader threads")
    notes.append("the loop does not sync every step (as training loops that overlap do); with "
                 "loss.item() every step the next copy starts only after the step, so it shows "
                 "in the step time (row 'loss.item() every step')")
    return {"rows": rows, "ratios": ratios, "notes": notes}

