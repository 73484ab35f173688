"""The per-sample Python stage of ``zerowait.Loader(map=fn)``.

The C++ loader reads, checks, decodes and batches; this stage then runs ``fn`` on every sample of
each batch and collates what ``fn`` returns into batch columns again. Work is dealt a whole batch
at a time, like the DataLoader's workers, to processes ("process" mode), threads ("thread") or
the calling thread (``map_workers=0``).

Process mode moves no sample through pickle. The parent copies each batch's columns once into a
shared-memory file of its own ("slot"); a worker maps it and hands ``fn`` views of its sample.
The worker stacks ``fn``'s arrays straight into the slot's output file, and the parent copies
the stacked columns out. Only the small things travel through the pipes: the layout of a slot,
keys, non-array results.

Here: the public stage (the parent's side: dealing batches, deaths, order, state). Beside it:
_map_columns.py (columns in and out of flat buffers), _map_shared.py (the shared-memory files
and folders), _map_worker.py (what a worker process runs).

Guarantees (docs/loader.md, "Per-sample Python"):
- every call sees ``sample["__seed__"]``, drawn from (seed, epoch, sample index), and in
  process and inline modes ``random``, ``numpy.random`` and ``torch`` are seeded with it: random
  augmentations are the same after an exact resume and whatever the number of workers. Threads
  share those generators, so in thread mode fn draws from its own (e.g.
  ``numpy.random.default_rng(sample["__seed__"])``).
- batches come back in the loader's order; ``state_dict()`` counts only batches returned.
- an exception in ``fn`` names the sample and follows ``on_corrupt``; a worker that dies is
  reported with the sample it held and replaced, and its batches run again (or, with
  ``map_on_worker_death="raise"``, MapWorkerError is raised and the loader stands before the
  batch, so nothing is lost or repeated).
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import queue
import signal
import threading
import time
import warnings
import weakref
from multiprocessing import connection
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from zerowait import _core
from zerowait._map_columns import (MapError, _collate, _from_numpy, _Layout, _OutputWriter,
                                   _read_output)
from zerowait._map_shared import Folders, NoSpace, Slots, Status
from zerowait._map_worker import _run_fn, _worker_main

MAP_MODES = ("process", "thread")
WORKER_DEATH_POLICIES = ("retry", "raise")
# A sample that was running in a worker at this many deaths is treated as corrupt.
_DEATHS_BEFORE_POISON = 2


class MapWorkerError(MapError):
    """A map worker process died (a crash, the OOM killer, a signal) while it held a sample."""


# ---------------------------------------------------------------------------------------------
# The parent side.

class _Batch:
    """A batch taken from the C++ loader and not yet returned."""

    def __init__(self, batch_id: int, state: Dict[str, Any], epoch: int) -> None:
        self.id = batch_id
        self.state = state  # the C++ loader's state just before this batch
        self.epoch = epoch
        self.arrays: Dict[str, Any] = {}
        self.index: Optional[np.ndarray] = None
        self.keys: Optional[List[str]] = None
        self.layout: Optional[_Layout] = None
        self.slot: Optional[str] = None
        self.worker: Optional[int] = None
        self.exclude: set = set()
        self.deaths: Dict[int, int] = collections.Counter()  # row -> deaths while it ran
        self.outcome: Optional[Tuple] = None
        self.cancelled = False


class MapStage:
    """Runs ``fn`` over the batches of a C++ loader; see the module docstring."""

    def __init__(self, fn: Callable, *, workers: int, mode: str, seed: int, on_corrupt: str,
                 on_worker_death: str, prefetch: int, start_method: Optional[str],
                 keys: bool, as_torch: bool, text: Dict[str, str],
                 shared_dir: Optional[str] = None) -> None:
        if not callable(fn):
            raise TypeError(f"map must be callable, not {type(fn).__name__}")
        if mode not in MAP_MODES:
            raise ValueError(f"map_mode must be one of {MAP_MODES}, not {mode!r}")
        if on_worker_death not in WORKER_DEATH_POLICIES:
            raise ValueError(f"map_on_worker_death must be one of {WORKER_DEATH_POLICIES}, "
                             f"not {on_worker_death!r}")
        if workers < 0 or prefetch < 1:
            raise ValueError("map_workers must be >= 0 and map_prefetch >= 1")
        self._fn = fn
        self._mode = mode if workers > 0 else "inline"
        self._workers = workers
        self._seed = seed
        self._on_corrupt = on_corrupt
        self._on_worker_death = on_worker_death
        self._keys = keys
        self._as_torch = as_torch
        self._text = text  # fields fn gets as str / JSON values (text_fields.py)
        self._depth = workers * prefetch if workers > 0 else 1
        self._core: Any = None
        self._describe: Callable[[int], Dict[str, Any]] = lambda index: {}
        self._next_id = 1
        # Batches taken and not yet returned, oldest first; and cancelled ones whose workers
        # have not answered yet (their slots stay taken until they do).
        self._inflight: "collections.OrderedDict[int, _Batch]" = collections.OrderedDict()
        self._cancelled: Dict[int, _Batch] = {}
        # A batch finished but held back while an error is raised first: (state, columns).
        self._ready: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None
        self._epoch_ended = False
        self._errors: List[Exception] = []
        self._closed = False
        self._stats: Dict[str, Any] = dict(
            mode=self._mode, workers=workers, batches=0, samples=0, fn_s=0.0, wait_s=0.0,
            errors=0, worker_deaths=0, deaths=[])
        if self._mode == "process":
            self._start_processes(start_method, shared_dir)
        elif self._mode == "thread":
            self._tasks: "queue.Queue" = queue.Queue()
            self._results: "queue.Queue" = queue.Queue()
            self._cancel_upto = 0
            self._threads = [threading.Thread(target=self._thread_main, daemon=True,
                                              name=f"zerowait-map-{i}") for i in range(workers)]
            for t in self._threads:
                t.start()

    def attach(self, core: Any) -> None:
        """The C++ loader to draw batches from (made after the workers were forked, so that no
        loader thread exists in a forked child)."""
        self._core = core
        self._describe = core.describe_sample

    # -- process workers ----------------------------------------------------------------------

    def _start_processes(self, start_method: Optional[str], shared_dir: Optional[str]) -> None:
        self._slots = Slots(shared_dir)
        self._status = Status(os.path.join(self._slots.folder, "status"), self._workers,
                              create=True)
        self._context = multiprocessing.get_context(start_method or "fork")
        self._procs: List[Any] = [None] * self._workers
        self._conns: List[Any] = [None] * self._workers
        for w in range(self._workers):
            self._spawn(w)
        # A loader dropped without close() still stops its workers and frees the shared memory.
        self._finalizer = weakref.finalize(self, _stop_workers, self._procs, self._conns,
                                           self._slots.folders)

    def _spawn(self, w: int) -> None:
        parent, child = self._context.Pipe()
        proc = self._context.Process(
            target=_worker_main, name=f"zerowait-map-{w}", daemon=True,
            args=(w, self._fn, child, self._slots.folder, self._workers, self._as_torch))
        proc.start()
        child.close()
        self._procs[w], self._conns[w] = proc, parent

    def _move(self, batch: _Batch, nbytes: int, reason: str) -> None:
        """A worker found no room for ``nbytes`` of fn's results beside ``batch``'s slot: the
        batch moves to the fallback folder and is dealt again, or fails naming the fix."""
        try:
            if self._slots.in_current_folder(batch.slot):
                self._slots.leave_full_folder(nbytes)
            slot = self._slots.place(batch.layout.nbytes, copy_from=batch.slot)
        except NoSpace as e:
            batch.outcome = ("nospace", batch.id, f"{e} ({reason})")
            return
        self._slots.discard(batch.slot)
        batch.slot = slot
        self._deal(batch)

    # -- thread workers -----------------------------------------------------------------------

    def _thread_main(self) -> None:
        while True:
            batch = self._tasks.get()
            if batch is None:
                return
            if batch.id <= self._cancel_upto:
                self._results.put(("cancelled", batch.id))
                continue
            self._results.put(self._run_here(batch, lambda row: batch.id > self._cancel_upto))

    def _run_here(self, batch: _Batch, progress: Callable[[int], bool]) -> Tuple:
        """Runs a batch in this process (thread and inline modes): the reply a worker sends,
        with the columns themselves in place of their layout."""
        task = dict(seed=self._seed, epoch=batch.epoch, exclude=batch.exclude,
                    threads=self._mode == "thread", text=self._text)
        outcome = _run_fn(self._fn, batch.layout, batch.arrays, batch.keys, task, self._as_torch,
                          progress)
        if outcome is None:
            return ("cancelled", batch.id)
        kept, results, errors, fn_s = outcome
        try:
            columns = None
            if results:
                writer = _OutputWriter(_collate(results))
                buffer = bytearray(writer.nbytes)
                columns = _read_output(writer.write(buffer), buffer, self._as_torch)
            return ("done", batch.id, kept, columns, errors, fn_s)
        except Exception as e:  # noqa: BLE001 - a batch that cannot be collated
            return ("failed", batch.id, f"{type(e).__name__}: {e}", fn_s)

    # -- drawing and dealing batches ----------------------------------------------------------

    def _take(self, timeout: Optional[float]) -> Optional[bool]:
        """Takes one batch from the C++ loader and deals it: True; False at the end of the
        epoch; None when none is ready within ``timeout`` = 0."""
        if self._epoch_ended:
            return False
        state, epoch = self._core.state_dict(), self._core.epoch
        try:
            arrays = self._core.next(timeout)
        except _core.DeadlineExceededError:
            if timeout == 0:
                return None
            raise
        if arrays is None:
            self._epoch_ended = True
            return False
        batch = _Batch(self._next_id, state, epoch)
        self._next_id += 1
        batch.index = np.array(arrays["__index__"])
        batch.keys = arrays.get("__key__")
        batch.layout = _Layout(arrays)
        if self._mode == "process":
            try:
                batch.slot = self._slots.place(batch.layout.nbytes)
            except NoSpace as e:
                self._core.load_state_dict(state)  # the loader stands before this batch again
                raise MapError(str(e)) from None
            batch.layout.write(arrays, self._slots.shared(batch.slot).buffer())
            self._inflight[batch.id] = batch
            self._deal(batch)
            return True
        self._inflight[batch.id] = batch
        batch.arrays = arrays  # threads read the loader's own arrays
        if self._mode == "thread":
            self._tasks.put(batch)
        return True

    def _deal(self, batch: _Batch) -> None:
        """Sends a batch to the process worker with the fewest batches."""
        load = collections.Counter(b.worker for b in self._inflight.values()
                                   if b.outcome is None)
        w = min(range(self._workers), key=lambda i: load[i])
        batch.worker = w
        try:
            self._conns[w].send(dict(batch=batch.id, slot=batch.slot, layout=batch.layout,
                                     keys=batch.keys, seed=self._seed, epoch=batch.epoch,
                                     exclude=batch.exclude, text=self._text))
        except OSError:  # the worker died while idle: replaced, and its batches (this one) dealt
            self._handle_death(w)

    def _fill(self) -> None:
        """Deals batches, without waiting, until ``depth`` are in flight. An error of the C++
        loader (a corrupt sample with on_corrupt="raise") is raised by the next next()."""
        try:
            while len(self._inflight) < self._depth and self._take(0):
                pass
        except _core.ZerowaitError as e:
            self._errors.append(e)

    # -- replies -------------------------------------------------------------------------------

    def _receive(self, reply: Tuple) -> None:
        batch_id = reply[1]
        if batch_id in self._cancelled:
            self._release(self._cancelled.pop(batch_id))
            return
        batch = self._inflight.get(batch_id)
        if batch is None or batch.outcome is not None:
            return
        if reply[0] == "cancelled":  # cannot happen to a live batch; deal it again if it does
            self._deal(batch)
            return
        if reply[0] == "nospace":
            self._move(batch, reply[2], reply[3])
            return
        batch.outcome = reply

    def _release(self, batch: _Batch) -> None:
        self._inflight.pop(batch.id, None)
        if batch.slot is not None:
            self._slots.release(batch.slot)
            batch.slot = None
        batch.arrays = {}

    def _poll(self, timeout: Optional[float]) -> None:
        """Handles the replies and worker deaths of up to ``timeout`` seconds."""
        if self._mode == "thread":
            try:
                self._receive(self._results.get(timeout=timeout))
                while True:
                    self._receive(self._results.get_nowait())
            except queue.Empty:
                return
        sentinels = {p.sentinel: w for w, p in enumerate(self._procs)}
        ready = connection.wait(self._conns + list(sentinels), timeout)
        for item in ready:
            if item in sentinels:
                continue
            try:
                while item.poll():
                    self._receive(item.recv())
            except (EOFError, OSError):
                pass  # its death is handled through the sentinel
        for item in ready:
            if item in sentinels:
                self._handle_death(sentinels[item])

    def _handle_death(self, w: int) -> None:
        proc, conn = self._procs[w], self._conns[w]
        try:
            while conn.poll():  # replies it sent before it died still count
                self._receive(conn.recv())
        except (EOFError, OSError):
            pass
        proc.join()
        conn.close()
        held_batch, held_row = self._status.running(w)
        self._status.words[1 + 2 * w] = 0
        self._status.words[2 + 2 * w] = -1
        code = proc.exitcode
        cause = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
                 else f"exited with status {code}")
        self._spawn(w)
        for batch in [b for b in self._cancelled.values() if b.worker == w]:
            self._release(self._cancelled.pop(batch.id))  # no answer will come
        lost = [b for b in self._inflight.values() if b.worker == w and b.outcome is None]
        held = self._inflight.get(held_batch)
        where, describe = "between samples", {}
        if held is not None and held_row >= 0 and held.worker == w:
            index = int(held.index[held_row])
            describe = dict(index=index, **self._describe(index))
            where = f"on {sample_name(describe)}"
            held.deaths[held_row] += 1
        self._stats["worker_deaths"] += 1
        death = dict(worker=w, pid=proc.pid, cause=cause, **describe)
        self._stats["deaths"] = (self._stats["deaths"] + [death])[-16:]
        message = f"zerowait map worker {w} (pid {proc.pid}) {cause} while running fn {where}"
        if self._on_worker_death == "raise":
            self._rewind()
            raise MapWorkerError(message + "; the loader stands before that batch",
                                 *(describe.get(k) for k in ("index", "shard", "key")))
        warnings.warn(message + "; it was replaced and its batches run again", RuntimeWarning,
                      stacklevel=5)
        for batch in lost:
            for row, deaths in batch.deaths.items():
                if deaths >= _DEATHS_BEFORE_POISON and row not in batch.exclude:
                    batch.exclude.add(row)
                    self._sample_failed(batch, row, f"the worker running fn on it died "
                                                    f"{deaths} times ({cause})")
            self._deal(batch)

    # -- results -------------------------------------------------------------------------------

    def _sample_failed(self, batch: _Batch, row: int, reason: str) -> None:
        index = int(batch.index[row])
        where = dict(index=index, **self._describe(index))
        self._stats["errors"] += 1
        if self._on_corrupt == "raise":
            self._errors.append(MapError(f"map fn failed on {sample_name(where)}: {reason}",
                                         index, where.get("shard"), where.get("key")))

    def _finish(self, batch: _Batch) -> Dict[str, Any]:
        reply = batch.outcome
        self._stats["batches"] += 1
        try:
            if reply[0] == "nospace":
                raise MapError(reply[2])
            if reply[0] == "failed":
                self._stats["fn_s"] += reply[3]
                raise MapError(f"map fn's results for the batch starting at sample "
                               f"{int(batch.index[0])} cannot be collated: {reply[2]}")
            _, _, kept, payload, errors, fn_s = reply
            self._stats["fn_s"] += fn_s
            self._stats["samples"] += len(kept)
            for row, reason in errors:
                self._sample_failed(batch, row, reason)
            if payload is None:
                columns: Dict[str, Any] = {}
            elif self._mode == "process":
                output = self._slots.shared(batch.slot + ".out")
                output.remap()
                columns = _read_output(payload, output.buffer(), self._as_torch)
            else:
                columns = payload
        finally:
            self._release(batch)
        columns.setdefault("__index__", _from_numpy(batch.index[kept], None, self._as_torch))
        if self._keys:
            columns.setdefault("__key__", [batch.keys[r] for r in kept] if batch.keys else [])
        return columns

    def next(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The next batch through fn, None at the end of the epoch; see Loader.next()."""
        if self._closed:
            raise _core.CancelledError("the loader is closed")
        if self._errors:
            raise self._errors.pop(0)
        if self._ready is not None:
            columns, self._ready = self._ready[1], None
            return columns
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._mode == "process":
            self._poll(0)  # replies, and deaths of workers that held nothing
        if not self._inflight:
            taken = self._take(timeout)
            if taken is None:
                raise _core.DeadlineExceededError("no batch ready (timeout 0; nothing is lost)")
            if not taken:
                self._epoch_ended = False  # the loader now stands at the next epoch
                return None
        self._fill()
        oldest = next(iter(self._inflight.values()))
        start = time.perf_counter()
        try:
            if self._mode == "inline":
                oldest.outcome = self._run_here(oldest, lambda row: True)
            while oldest.outcome is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise _core.DeadlineExceededError(
                        f"no batch through map fn within {timeout} s (nothing is lost)")
                self._poll(0.05 if left is None else min(left, 0.05))
                self._fill()
        finally:
            self._stats["wait_s"] += time.perf_counter() - start
        state = oldest.state
        columns = self._finish(oldest)
        self._fill()
        if self._errors:
            # Raised first, as on_corrupt="raise" does in the C++ stages; the batch, without
            # the failed samples, comes with the next call.
            self._ready = (state, columns)
            raise self._errors.pop(0)
        return columns

    # -- state ----------------------------------------------------------------------------------

    @property
    def wait_s(self) -> float:
        """Seconds next() has waited on fn's results (stats()["wait_s"], without its /proc
        reads)."""
        return self._stats["wait_s"]

    def pending(self) -> int:
        """Batches taken from the C++ loader and not yet returned."""
        return len(self._inflight) + (self._ready is not None)

    def state_dict(self) -> Dict[str, Any]:
        """The C++ loader's state before the oldest batch not yet returned."""
        if self._ready is not None:
            return dict(self._ready[0])
        if self._inflight:
            return dict(next(iter(self._inflight.values())).state)
        return self._core.state_dict()

    def _cancel_all(self) -> None:
        """Drops every batch in flight; their workers stop at their next sample."""
        for batch in list(self._inflight.values()):
            if batch.outcome is not None or self._mode != "process":
                self._release(batch)
            else:  # its slot stays taken until its worker answers
                self._inflight.pop(batch.id)
                self._cancelled[batch.id] = batch
        if self._mode == "process":
            self._status.words[0] = self._next_id - 1
        elif self._mode == "thread":
            self._cancel_upto = self._next_id - 1
        self._ready = None
        self._epoch_ended = False
        self._errors.clear()

    def _rewind(self) -> None:
        state = self.state_dict()
        self._cancel_all()
        self._core.load_state_dict(state)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._cancel_all()
        self._core.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self._cancel_all()
        self._core.set_epoch(epoch)

    def stats(self) -> Dict[str, Any]:
        stats = dict(self._stats, deaths=list(self._stats["deaths"]))
        if self._mode == "process":
            stats["worker_pids"] = [p.pid for p in self._procs]
            memory = [process_memory(p.pid) for p in self._procs]
            stats["worker_rss_bytes"] = [m["rss"] for m in memory]
            stats["worker_unique_bytes"] = [m["unique"] for m in memory]
            stats["shared_dir"] = self._slots.folders.current
            stats["shared_fallbacks"] = self._slots.folders.fallbacks
        return stats

    def close(self) -> None:
        """Stops the workers and removes the shared-memory files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._mode == "thread":
            self._cancel_upto = 1 << 62
            for _ in self._threads:
                self._tasks.put(None)
            for t in self._threads:
                t.join()
        elif self._mode == "process":
            self._status.words[0] = 1 << 62  # workers stop at their next sample
            self._finalizer()
            self._slots.close()
            self._status.file.close()
        self._inflight.clear()
        self._cancelled.clear()


def _stop_workers(procs: List[Any], conns: List[Any], folders: Folders) -> None:
    for conn in conns:
        try:
            conn.send(None)
        except OSError:
            pass
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()
    folders.remove()


def sample_name(where: Dict[str, Any]) -> str:
    """'sample 12, key 'a/b', shard s.zws #3' from index and describe_sample()."""
    parts = [f"sample {where['index']}"]
    if where.get("key"):
        parts.append(f"key {where['key']!r}")
    if where.get("shard"):
        parts.append(f"shard {where['shard']} #{where.get('shard_index')}")
    return ", ".join(parts)


def process_memory(pid: int) -> Dict[str, int]:
    """A process's resident bytes, and of them the ones no other process shares (its
    copy-on-write pages written since the fork, its own allocations): zeros if it is gone."""
    out = dict(rss=0, unique=0)
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "Rss":
                    out["rss"] = int(rest.split()[0]) * 1024
                elif name in ("Private_Clean", "Private_Dirty"):
                    out["unique"] += int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out
