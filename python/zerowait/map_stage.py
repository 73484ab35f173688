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
import errno
import multiprocessing
import os
import queue
import random
import signal
import threading
import time
import traceback
import warnings
import weakref
from multiprocessing import connection
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from zerowait import _core
from zerowait._map_shared import Folders, NoSpace, SharedFile, Slots, Status
from zerowait.text_fields import parse_value

MAP_MODES = ("process", "thread")
WORKER_DEATH_POLICIES = ("retry", "raise")
_MASK64 = (1 << 64) - 1
# A sample that was running in a worker at this many deaths is treated as corrupt.
_DEATHS_BEFORE_POISON = 2


class MapError(_core.ZerowaitError, RuntimeError):
    """``fn`` raised on a sample, or returned something that cannot be collated. ``index``,
    ``shard``, ``key`` name the sample (None when the batch as a whole failed)."""

    def __init__(self, message: str, index: Optional[int] = None,
                 shard: Optional[str] = None, key: Optional[str] = None) -> None:
        super().__init__(message)
        self.index, self.shard, self.key = index, shard, key


class MapWorkerError(MapError):
    """A map worker process died (a crash, the OOM killer, a signal) while it held a sample."""


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of ``fn``'s call on sample ``index`` in ``epoch``: a splitmix64 mix, so nearby
    indices get unrelated seeds. Non-negative and below 2**63 (torch.manual_seed accepts it)."""
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + index + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


def _seed_generators(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch = _torch()
    if torch is not None:
        # The CPU generator alone: torch.manual_seed() also visits every accelerator backend,
        # ~90 us a call.
        torch.default_generator.manual_seed(seed)


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # numpy output without torch installed
        return None
    return torch


# ---------------------------------------------------------------------------------------------
# Batch columns in and out of flat buffers.

def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or type(value).__name__ == "Tensor"


def _to_numpy(value: Any) -> Tuple[np.ndarray, Optional[str]]:
    """An array as a numpy array, and the torch dtype its bytes stand for where numpy has none
    (bfloat16 and friends travel as bytes; None otherwise)."""
    if isinstance(value, np.ndarray):
        return value, None
    tensor = value.detach().cpu().contiguous()
    try:
        return tensor.numpy(), None
    except TypeError:
        return tensor.reshape(-1).view(_torch().uint8).numpy(), str(tensor.dtype)


def _from_numpy(array: np.ndarray, torch_dtype: Optional[str], as_torch: bool,
                shape: Optional[Tuple[int, ...]] = None) -> Any:
    """The inverse of _to_numpy: numpy, or torch with as_torch or a dtype only torch has
    (its bytes in `array`, `shape` the tensor's)."""
    if torch_dtype is None:
        return _torch().from_numpy(array) if as_torch else array
    torch = _torch()
    dtype = getattr(torch, torch_dtype.split(".", 1)[1])
    return torch.from_numpy(array).view(dtype).reshape(shape)


class _Layout:
    """Where each input column of a batch lies in a flat buffer, and the per-sample views."""

    def __init__(self, arrays: Dict[str, Any]) -> None:
        self.n = len(arrays["__index__"])
        # (name, kind, offset, nbytes, numpy dtype string, shape)
        self.columns: List[Tuple[str, str, int, int, str, Tuple[int, ...]]] = []
        offset = 0
        for name, value in arrays.items():
            if name == "__key__":
                continue
            kind = "raw" if name + ".offsets" in arrays else "rows"
            if name.endswith(".offsets") and name[: -len(".offsets")] in arrays:
                kind = "offsets"
            self.columns.append((name, kind, offset, value.nbytes, value.dtype.str, value.shape))
            offset += (value.nbytes + 63) // 64 * 64
        self.nbytes = offset

    def write(self, arrays: Dict[str, Any], buffer: Any) -> None:
        for name, _kind, offset, nbytes, _dtype, _shape in self.columns:
            flat = np.ascontiguousarray(arrays[name]).reshape(-1).view(np.uint8)
            np.frombuffer(buffer, np.uint8, nbytes, offset)[:] = flat

    def views(self, buffer: Any) -> Dict[str, np.ndarray]:
        return {name: np.frombuffer(buffer, np.dtype(dtype), nbytes // np.dtype(dtype).itemsize,
                                    offset).reshape(shape)
                for name, _kind, offset, nbytes, dtype, shape in self.columns}

    def samples(self, arrays: Dict[str, Any], keys: Optional[List[str]], as_torch: bool):
        """Yields (row, sample dict) for every row: raw fields as uint8 numpy views, per-sample
        scalars as Python numbers, rows of larger columns as views (torch with as_torch)."""
        torch = _torch() if as_torch else None
        kinds = {name: kind for name, kind, *_ in self.columns}
        for row in range(self.n):
            sample: Dict[str, Any] = {}
            for name, kind in kinds.items():
                column = arrays[name]
                if kind == "raw":
                    offsets = arrays[name + ".offsets"]
                    sample[name] = column[offsets[row]:offsets[row + 1]]
                elif kind == "rows":
                    value = column[row]
                    if column.ndim == 1:
                        sample[name] = value.item()
                    else:
                        sample[name] = torch.from_numpy(value) if torch is not None else value
            if keys:
                sample["__key__"] = keys[row]
            yield row, sample


def _collate(results: List[Dict[str, Any]]) -> Dict[str, Tuple[str, Any]]:
    """Columns from fn's per-sample dicts: ("stack", array list) where every value is an array
    of one shape and dtype, ("ragged", arrays) for arrays of differing shapes, ("scalar", numpy
    array) for numbers, ("objects", list) for anything else."""
    names = list(results[0])
    for i, r in enumerate(results):
        if r.keys() != results[0].keys():
            raise MapError(f"fn returned keys {sorted(r)} for one sample and {sorted(names)} "
                           f"for another (row {i} of the batch); every sample needs the same keys")
    columns: Dict[str, Tuple[str, Any]] = {}
    for name in names:
        values = [r[name] for r in results]
        if all(_is_array(v) for v in values):
            first = values[0]
            same = all(v.shape == first.shape and v.dtype == first.dtype for v in values)
            columns[name] = ("stack" if same else "ragged", values)
        elif all(isinstance(v, bool) for v in values):
            columns[name] = ("scalar", np.array(values, dtype=np.bool_))
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            columns[name] = ("scalar", np.array(values, dtype=np.int64))
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            columns[name] = ("scalar", np.array(values, dtype=np.float64))
        else:
            columns[name] = ("objects", values)
    return columns


class _OutputWriter:
    """Lays stacked and ragged columns into a flat buffer: plan() sizes it, write() fills it
    and returns the metadata the reader needs."""

    def __init__(self, columns: Dict[str, Tuple[str, Any]]) -> None:
        self.columns = columns
        self.nbytes = 0
        self.plan: Dict[str, Any] = {}
        for name, (kind, values) in columns.items():
            if kind in ("stack", "ragged"):
                arrays = [(*_to_numpy(v), tuple(v.shape)) for v in values]
                self.plan[name] = (arrays, self.nbytes)
                self.nbytes += sum((a.nbytes + 63) // 64 * 64 for a, _, _ in arrays)

    def write(self, buffer: Any) -> Dict[str, Any]:
        meta: Dict[str, Any] = {}
        for name, (kind, values) in self.columns.items():
            if kind in ("scalar", "objects"):
                meta[name] = (kind, values)
                continue
            arrays, offset = self.plan[name]
            pieces = []
            for array, torch_dtype, shape in arrays:
                flat = np.frombuffer(buffer, np.uint8, array.nbytes, offset)
                flat[:] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                pieces.append((offset, array.dtype.str, array.shape, torch_dtype, shape))
                offset += (array.nbytes + 63) // 64 * 64
            meta[name] = (kind, pieces)
        return meta


def _read_output(meta: Dict[str, Any], buffer: Any, as_torch: bool) -> Dict[str, Any]:
    """The batch columns described by _OutputWriter.write(), copied out of ``buffer``."""
    out: Dict[str, Any] = {}
    for name, (kind, payload) in meta.items():
        if kind == "objects":
            out[name] = payload
        elif kind == "scalar":
            out[name] = _from_numpy(payload, None, as_torch)
        else:
            arrays = []
            for offset, dtype, shape, torch_dtype, tensor_shape in payload:
                dt = np.dtype(dtype)
                count = int(np.prod(shape, dtype=np.int64))
                a = np.frombuffer(buffer, dt, count, offset).reshape(shape)
                arrays.append((a, torch_dtype, tensor_shape))
            if kind == "stack":
                stacked = np.stack([a for a, _, _ in arrays])
                _, torch_dtype, tensor_shape = arrays[0]
                out[name] = _from_numpy(stacked, torch_dtype, as_torch,
                                        (len(arrays), *tensor_shape))
            else:
                out[name] = [_from_numpy(a.copy(), t, as_torch, s) for a, t, s in arrays]
    return out


def _run_fn(fn: Callable, layout: _Layout, arrays: Dict[str, Any], keys: Optional[List[str]],
            task: Dict[str, Any], as_torch: bool, progress: Callable[[int], bool]):
    """fn over the rows of one batch: (kept rows, results, errors, seconds in fn). ``progress``
    is told each row before it runs and returns False when the batch was cancelled. The global
    generators are seeded unless ``task["threads"]``: threads share them, so there only
    ``sample["__seed__"]`` makes a draw repeatable."""
    kept: List[int] = []
    results: List[Dict[str, Any]] = []
    errors: List[Tuple[int, str]] = []
    skip = task["exclude"]
    indices = arrays["__index__"]
    fn_s = 0.0
    for row, sample in layout.samples(arrays, keys, as_torch):
        if row in skip:
            continue
        if not progress(row):
            return None
        seed = sample_seed(task["seed"], task["epoch"], int(indices[row]))
        sample["__seed__"] = seed
        if not task.get("threads"):
            _seed_generators(seed)
        start = time.perf_counter()
        try:
            for name, kind in task["text"].items():
                if name in sample:
                    sample[name] = parse_value(kind, sample[name])
            result = fn(sample)
            if not isinstance(result, dict):
                raise TypeError(f"map fn must return a dict, not {type(result).__name__}")
        except Exception as e:  # noqa: BLE001 - reported to the parent, which applies on_corrupt
            errors.append((row, f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}"))
            continue
        finally:
            fn_s += time.perf_counter() - start
        kept.append(row)
        results.append(result)
    return kept, results, errors, fn_s


def _worker_main(worker: int, fn: Callable, conn: Any, folder: str, workers: int,
                 as_torch: bool) -> None:
    """A map worker process: runs batches from ``conn`` until told to stop or the parent goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(1)  # the workers are the parallelism; torch's own pool oversubscribes
    status = Status(os.path.join(folder, "status"), workers, create=False)
    words = status.words
    files: Dict[str, SharedFile] = {}

    def shared(name: str) -> SharedFile:  # a slot's name, or its path in a fallback folder
        if name not in files:
            files[name] = SharedFile(os.path.join(folder, name))
        return files[name]

    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if task is None:
            return
        batch_id = task["batch"]

        def progress(row: int) -> bool:
            words[1 + 2 * worker] = batch_id
            words[2 + 2 * worker] = row
            return batch_id > words[0]

        if batch_id <= words[0]:
            conn.send(("cancelled", batch_id))
            continue
        source = shared(task["slot"])
        source.remap()
        layout: _Layout = task["layout"]
        arrays = layout.views(source.buffer())
        outcome = _run_fn(fn, layout, arrays, task["keys"], task, as_torch, progress)
        words[2 + 2 * worker] = -1
        del arrays
        if outcome is None:
            conn.send(("cancelled", batch_id))
            continue
        kept, results, errors, fn_s = outcome
        try:
            meta = None
            if results:
                writer = _OutputWriter(_collate(results))
                target = shared(task["slot"] + ".out")
                try:
                    target.grow(writer.nbytes)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    # The parent moves the batch to a folder with room and deals it again.
                    conn.send(("nospace", batch_id, writer.nbytes, e.strerror))
                    continue
                meta = writer.write(target.buffer())
            conn.send(("done", batch_id, kept, meta, errors, fn_s))
        except Exception as e:  # noqa: BLE001 - a batch that cannot be collated
            conn.send(("failed", batch_id, f"{type(e).__name__}: {e}", fn_s))


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
