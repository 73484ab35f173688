"""Saves that never block the step: the background copy of a save's host tensors, and the guards
that keep its snapshot exactly the state at ``save()`` (docs/checkpoint.md, "A save that never
blocks").

``save()`` copies now only the host tensors that something other than an optimizer step could
change while the training loop runs on (BatchNorm statistics, an EMA copy, numpy arrays: small,
as a rule). The tensors an optimizer owns — its parameters and state, almost all of the bytes —
are copied by the engine's threads after ``save()`` returned, and are guarded:

- a global optimizer step pre-hook makes any step of an optimizer owning such a tensor wait until
  the copy is done (the only change a training loop makes to them);
- each such tensor's ``_version`` (torch's count of in-place changes, shared by ``detach()`` and
  views) is recorded at ``save()`` and compared once the copy is done: a tensor changed meanwhile
  by anything else (an in-place edit outside ``optimizer.step()``) fails the save, naming it,
  and the engine publishes nothing of it. The comparison is made on the thread that called
  ``save()``, at its next optimizer step, ``save()``, ``load()``, ``wait()`` or ``close()``, or
  when its handle is asked ``done()``/``wait()`` — where that thread has no in-place operation
  half done — and the engine waits for it before it publishes the part.

Optimizers are known to the Checkpointer once they have stepped with the hook installed (it is
installed with the first such Checkpointer): until then every tensor is copied in ``save()``.
"""

from __future__ import annotations

import bisect
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

_known_optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()
_pending: set = set()  # BackgroundCopy objects still waiting for their verdict
_hook_installed = False
# optimizer -> (fingerprint, {start address: (end address, id(optimizer))}) of its host memory.
# Optimizers appear by id only, so that nothing here keeps one alive.
_spans_cache: "weakref.WeakKeyDictionary[Any, Tuple[Any, Dict[int, Tuple[int, Any]]]]" = (
    weakref.WeakKeyDictionary())
_owned_cache: List[Any] = [None, None]  # [fingerprints, OwnedMemory]


def install_step_hook(torch: Any) -> None:
    """Registers the process's one optimizer step pre-hook (once)."""
    global _hook_installed
    if not _hook_installed:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(_before_optimizer_step)
        _hook_installed = True


def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _known_optimizers.add(optimizer)
    for copy in list(_pending):
        if id(optimizer) in copy.owners:
            copy.settle(blocking_step=True, judge=True)
    return None


# --- which memory the optimizers own ----------------------------------------------------------


class OwnedMemory:
    """The host memory of the known optimizers' parameters and state: which optimizer (its id),
    if any, owns all of ``nbytes`` at ``address``."""

    def __init__(self, spans: Dict[int, Tuple[int, int]]) -> None:
        self._spans = spans
        self._starts: Optional[List[int]] = None  # sorted, made on the first miss

    def owner(self, address: int, nbytes: int) -> Optional[int]:
        span = self._spans.get(address)  # a state_dict() tensor: a parameter itself
        if span is None:  # a view or a piece of one
            if self._starts is None:
                self._starts = sorted(self._spans)
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return None
            span = self._spans[self._starts[i]]
        end, owner = span
        return owner if address + nbytes <= end else None


def _fingerprint(optimizer: Any) -> Tuple[Any, ...]:
    """Changes when parameters are added or replaced in a group, or the state is created or
    replaced (load_state_dict). A stale answer costs at worst a failed save, never a torn one:
    the version check still runs."""
    state = optimizer.state
    return (id(state), len(state),
            tuple((id(g["params"]), len(g["params"])) for g in optimizer.param_groups))


def _host_span(torch: Any, value: Any) -> Optional[Tuple[int, int]]:
    if not isinstance(value, torch.Tensor):
        return None
    local = getattr(value, "_local_tensor", value)  # a DTensor's own shard
    if not local.is_cpu or local.layout is not torch.strided or local.nbytes == 0:
        return None
    start = local.data_ptr()
    if local.is_contiguous():
        return start, start + local.nbytes
    storage = local.untyped_storage()  # a strided view: all of its storage, conservatively
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _optimizer_spans(torch: Any, optimizer: Any) -> Dict[int, Tuple[int, int]]:
    spans: Dict[int, Tuple[int, int]] = {}
    owner = id(optimizer)
    for group in optimizer.param_groups:
        for param in group["params"]:
            span = _host_span(torch, param)
            if span is not None:
                spans[span[0]] = (span[1], owner)
    for values in optimizer.state.values():
        for value in values.values() if isinstance(values, dict) else ():
            span = _host_span(torch, value)
            if span is not None:
                spans[span[0]] = (span[1], owner)
    return spans


def owned_memory(torch: Any) -> OwnedMemory:
    """What the known optimizers own now (cached while their fingerprints stay the same)."""
    optimizers = list(_known_optimizers)
    prints = [(id(o), _fingerprint(o)) for o in optimizers]
    if _owned_cache[0] == prints:
        return _owned_cache[1]
    spans: Dict[int, Tuple[int, int]] = {}
    for optimizer, (_, fingerprint) in zip(optimizers, prints):
        cached = _spans_cache.get(optimizer)
        if cached is None or cached[0] != fingerprint:
            cached = (fingerprint, _optimizer_spans(torch, optimizer))
            _spans_cache[optimizer] = cached
        spans.update(cached[1])
    owned = OwnedMemory(spans)
    _owned_cache[:] = [prints, owned]
    return owned


# --- one save's background copy ------------------------------------------------------------------


class CopyWaits:
    """Seconds the training loop waited for background copies outside ``save()`` (optimizer
    steps, ``load()``): part of the Checkpointer's ``blocked_s``."""

    def __init__(self) -> None:
        self.blocked_s = 0.0
        self.current: Optional["BackgroundCopy"] = None

    def settle(self, blocking: bool = False) -> None:
        """Settles the current background copy, if any (waiting for it): for the Checkpointer's
        own calls, made on the thread that saves."""
        if self.current is not None:
            self.current.settle(blocking_step=blocking, judge=True)


class BackgroundCopy:
    """The background copy of one save: holds the tensors it reads until it is done, and gives
    the engine the verdict on it (``settle``)."""

    def __init__(self, handle: Any, step: int, names: List[str],
                 tracked: List[Tuple[int, Any, int]], keep: List[Any], owners: set,
                 waits: CopyWaits) -> None:
        self._handle = handle
        self._step = step
        self._names = names
        self._tracked = tracked
        self._keep: Optional[List[Any]] = keep  # their memory must outlive the copy
        self.owners = owners
        self._waits = waits
        self._thread = threading.current_thread()
        self.settled = False
        self.wait_s = 0.0  # how long the training loop waited for this copy
        waits.current = self
        _pending.add(self)

    def settle(self, blocking_step: bool = False, only_if_copied: bool = False,
               judge: bool = False) -> None:
        """Waits for the copy (the GIL released), then checks that no tracked tensor changed
        while it ran and tells the engine. ``blocking_step``: an optimizer step is about to
        change the tensors: the wait holds the training loop (counted in ``blocked_s``), and the
        verdict is given now. Otherwise the verdict is given by the thread that saved (its
        in-place operations are all finished when it runs Python) or with ``judge``; another
        thread only waits. ``only_if_copied``: does nothing while the copy is still running."""
        if self.settled or (only_if_copied and not self._handle.copied()):
            return
        started = time.monotonic()
        self._handle.wait_copied()
        waited = time.monotonic() - started
        self.wait_s += waited
        if blocking_step:
            self._waits.blocked_s += waited
        elif (not judge and threading.current_thread() is not self._thread
              and self._thread.is_alive()):
            return
        if self.settled:  # judged by another thread meanwhile
            return
        changed = [self._names[index] for index, tensor, version in self._tracked
                   if tensor._version != version]
        torn = None
        if changed:
            listed = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more"
                                               if len(changed) > 5 else "")
            torn = (f"checkpoint step {self._step} is not saved: {listed} changed in place "
                    f"while save() was still copying it in the background (outside "
                    f"optimizer.step(), which waits for the copy); change such tensors after "
                    f"the next optimizer step, or save with Checkpointer(background_copy="
                    f"False)")
        self._handle.confirm_copy(torn)
        self.settled = True
        self._keep = None
        self._tracked = []
        self.owners = set()
        _pending.discard(self)
        if self._waits.current is self:
            self._waits.current = None
