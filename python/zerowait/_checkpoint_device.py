"""The GPU side of ``zerowait.Checkpointer``: copies between CUDA tensors and host memory.

Saving: each device's tensors are copied into the save's staging bytes (pinned when CUDA is
present) on a copy stream of that device, ordered after the work already queued on the caller's
current stream (so pending writes to the tensors land first). ``save()`` does not wait for these
copies: the caller's current stream waits for them instead, so later in-place updates (an
optimizer step) cannot tear the snapshot, and the C++ writer waits for them (an event recorded
on the copy stream) before it reads a staged byte.

Restoring: CUDA destinations are filled by the C++ reader through a pinned staging pool and
``cudaMemcpyAsync`` on the same copy streams, ordered after the caller's queued work on them.

``_host_addressable`` is the seam the CPU tests use to run these paths with CPU tensors.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Tuple

from zerowait import _core

# TensorRead::device values (include/zerowait/checkpoint/restore.hpp).
HOST_MEMORY = _core._ckpt_host_memory
HOST_THROUGH_STAGING = _core._ckpt_host_through_staging


def _host_addressable(tensor: Any) -> bool:
    """Whether C++ can read or write the tensor's bytes at its data_ptr() (else they go through
    staging: CUDA tensors). A seam the tests use to run the GPU paths with CPU tensors."""
    return tensor.is_cpu


def _staging_view(torch: Any, address: int, nbytes: int) -> Any:
    """A uint8 tensor over ``nbytes`` of staging memory at ``address`` (owned by C++)."""
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)


class DeviceCopies:
    """One Checkpointer's copy streams (one per CUDA device, made on first use) and what its
    saves' device copies cost. Not thread-safe (nor is the Checkpointer)."""

    def __init__(self) -> None:
        self._streams: Dict[int, Any] = {}

    def stream(self, torch: Any, device: int) -> Any:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    # --- saving --------------------------------------------------------------------------------

    def stage(self, tensors: List[Tuple[int, Any, int]], pending: Any) -> "StagedCopies":
        """Queues the copies of ``tensors`` — (index, contiguous tensor, nbytes) — into the
        staging of ``pending`` and returns without waiting for them. Each device's copies run on
        its copy stream after the caller's current stream's queued work; the caller's current
        stream then waits for them, and so does the C++ writer (``pending.wait_for_stream``, also
        when a copy fails to be queued: an unstarted save frees its pool only after them).
        Tensors not on a CUDA device (the tests' twin) are copied before this returns."""
        staged = StagedCopies()
        if not tensors:
            return staged  # a state of arrays: no need to import torch (a second or more)
        import torch

        by_device: Dict[int, List[Tuple[int, Any, int]]] = {}
        for index, tensor, nbytes in tensors:
            if nbytes == 0:
                continue
            if not tensor.is_cuda:
                _staging_view(torch, pending.staging(index), nbytes).copy_(
                    tensor.reshape(-1).view(torch.uint8))
                continue
            by_device.setdefault(tensor.device.index, []).append((index, tensor, nbytes))
        for device, items in by_device.items():
            stream = self.stream(torch, device)
            caller = torch.cuda.current_stream(device)
            stream.wait_stream(caller)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            try:
                with torch.cuda.stream(stream):
                    for index, tensor, nbytes in items:
                        host = _staging_view(torch, pending.staging(index), nbytes)
                        host.copy_(tensor.reshape(-1).view(torch.uint8), non_blocking=True)
                        # Memory the caller frees now is not reused by another stream until
                        # the copy has read it.
                        tensor.record_stream(stream)
                        staged.bytes += nbytes
            finally:
                end.record(stream)
                try:
                    pending.wait_for_stream(stream.cuda_stream, device)
                except BaseException:
                    stream.synchronize()  # the pool must not be freed under the copies
                    raise
            caller.wait_event(end)
            staged.events.append((start, end))
        return staged

    # --- restoring -----------------------------------------------------------------------------

    def read_target(self, tensor: Any) -> Tuple[int, int]:
        """(device, cudaStream_t) of a TensorRead into ``tensor``'s memory: HOST_MEMORY for
        memory the reads fill directly, the CUDA device and its copy stream for a CUDA tensor,
        HOST_THROUGH_STAGING for host memory the tests route through staging."""
        if tensor.is_cuda:
            import torch

            return tensor.device.index, self.stream(torch, tensor.device.index).cuda_stream
        return (HOST_MEMORY if _host_addressable(tensor) else HOST_THROUGH_STAGING), 0

    def order_after_callers(self, devices: Any) -> None:
        """Makes the copy streams of ``devices`` wait for the work queued so far on the
        caller's current streams there (writes to into= tensors, reuse of freed memory)."""
        if not devices:
            return  # nothing on a GPU: no need to import torch
        import torch

        for device in devices:
            self.stream(torch, device).wait_stream(torch.cuda.current_stream(device))


class StagedCopies:
    """The device copies of one save: bytes copied and a pair of timing events per device."""

    def __init__(self) -> None:
        self.bytes = 0
        self.events: List[Tuple[Any, Any]] = []

    def seconds(self) -> float:
        """GPU time of the copies (the longest device's), once they are done."""
        return max((start.elapsed_time(end) / 1000 for start, end in self.events), default=0.0)
