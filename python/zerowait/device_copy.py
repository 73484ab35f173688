"""Host batches to a CUDA device, the way ``Loader(device="cuda")`` does it.

Each batch is copied on a side stream of its own, so that the copy of batch k+1 runs while the
GPU computes on batch k; the consumer's stream waits on the copy's event, not the CPU. The host
batch, whose large columns point into page-locked arenas of the loader's pool, is held until its
copy's event has completed, and only then released back to the pool: an arena reused while a
copy still reads it would corrupt training silently.

The copies are timed with CUDA events on the GPU's own clock: ``copy_s`` (the copy stream busy
with this loader's batches) and ``wait_s`` (the consumer's stream stalled on a copy that had not
finished when it got there: GPU time lost to host-to-device input, which the StepProfiler counts
as ``h2d``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional


class DeviceCopy:
    """Copies loader batches to ``device`` (a CUDA device) on a side stream.

    ``out``: preallocated device tensors by column name, reused every step (CUDA graphs capture
    fixed addresses): each such column is copied into ``out[name][:n]``, after the consumer's
    stream has finished with what it last read there; their dtype and trailing shape must match
    the batch's and their first dimension must hold it. Other columns get new device tensors.
    ``arenas``: the loader's pool size; at most ``arenas - 2`` host batches wait on copies, so
    the pool never runs dry behind a slow GPU.
    """

    def __init__(self, device: str, arenas: int, out: Optional[Dict[str, Any]] = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but torch.cuda is not available")
        self._device = torch.device(device)
        if self._device.type != "cuda":
            raise ValueError(f"device must be 'cpu' or a CUDA device, not {device!r}")
        self._out = dict(out or {})
        for name, tensor in self._out.items():
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
                raise ValueError(f"out[{name!r}] must be a CUDA tensor")
        self._stream = torch.cuda.Stream(device=self._device)
        # (event, host batch): host batches whose copies may still run, oldest first.
        self._in_flight: List[tuple] = []
        # (start, end, reached, bytes): copies whose timing is not yet read.
        self._timing: List[tuple] = []
        self._max_in_flight = max(1, arenas - 2)
        self.copy_s = 0.0
        self.wait_s = 0.0
        self.bytes = 0
        self.batches = 0

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        import torch

        consumer = torch.cuda.current_stream(self._device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out: Dict[str, Any] = {}
        nbytes = 0
        with torch.cuda.stream(self._stream):
            if self._out:
                # The preallocated buffers may still be read by the consumer's last step.
                self._stream.wait_stream(consumer)
            start.record(self._stream)
            for name, value in batch.items():
                if not isinstance(value, torch.Tensor):
                    out[name] = value
                    continue
                target = self._out.get(name)
                if value.is_cuda and target is None:  # made on the GPU (GPU image decode)
                    out[name] = value
                    continue
                nbytes += value.numel() * value.element_size()
                if target is not None:
                    out[name] = _copy_into(name, target, value)
                else:
                    out[name] = value.to(self._device, non_blocking=True)
            end.record(self._stream)
        # The consumer's stream must not read before the copy is done; `reached` marks when it
        # got there, so that the wait it had (if any) can be measured.
        reached = torch.cuda.Event(enable_timing=True)
        reached.record(consumer)
        consumer.wait_event(end)
        for name, tensor in out.items():
            if (isinstance(tensor, torch.Tensor) and name not in self._out
                    and tensor is not batch[name]):
                tensor.record_stream(consumer)
        self._in_flight.append((end, batch))
        self._timing.append((start, end, reached, nbytes))
        self.poll()
        while len(self._in_flight) > self._max_in_flight:
            self._in_flight.pop(0)[0].synchronize()
        return out

    def poll(self) -> None:
        """Releases the host batches whose copies have finished and reads the timing of those
        whose events have all completed. Never blocks."""
        while self._in_flight and self._in_flight[0][0].query():
            self._in_flight.pop(0)
        while self._timing and all(e.query() for e in self._timing[0][:3]):
            start, end, reached, nbytes = self._timing.pop(0)
            self.copy_s += start.elapsed_time(end) / 1000.0
            self.wait_s += _stall_ms(reached, end) / 1000.0
            self.bytes += nbytes
            self.batches += 1

    def stats(self) -> Dict[str, Any]:
        """Copies timed so far: ``copy_s``, ``wait_s``, ``bytes``, ``batches``, ``gb_per_s``
        (bytes over copy time) and ``pending`` (copies not yet timed)."""
        self.poll()
        return {"copy_s": self.copy_s, "wait_s": self.wait_s, "bytes": self.bytes,
                "batches": self.batches, "pending": len(self._timing),
                "gb_per_s": self.bytes / self.copy_s / 1e9 if self.copy_s > 0 else None}


def _stall_ms(reached: Any, end: Any) -> float:
    """How long after `reached` (the consumer's stream got to the batch) the copy ended (`end`):
    the consumer's stall, 0 when the copy had ended first. Both events have completed."""
    try:
        return max(reached.elapsed_time(end), 0.0)
    except RuntimeError:
        # A runtime that refuses a negative interval: the copy ended before the consumer got
        # there (the other order is then a valid interval, which this checks).
        end.elapsed_time(reached)
        return 0.0


def _copy_into(name: str, target: Any, value: Any) -> Any:
    """value copied (non-blocking, on the current stream) into the leading rows of target."""
    if target.dtype != value.dtype:
        raise ValueError(f"out[{name!r}] is {target.dtype}, the batch's column is {value.dtype}")
    rows = value.shape[0]
    if (target.dim() != value.dim() or tuple(target.shape[1:]) != tuple(value.shape[1:])
            or target.shape[0] < rows):
        raise ValueError(f"out[{name!r}] has shape {tuple(target.shape)}; the batch's column "
                         f"needs {tuple(value.shape)} (the first dimension may be larger)")
    view = target[:rows] if target.shape[0] != rows else target
    view.copy_(value, non_blocking=True)
    return view
