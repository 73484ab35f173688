"""What a map worker runs for ``zerowait.Loader(map=fn)`` (map_stage.py): the seeds of each
call, ``fn`` over the rows of one batch, and the worker process's loop over the batches it is
dealt through its pipe and shared-memory slots.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from zerowait._map_columns import _collate, _Layout, _OutputWriter, _torch
from zerowait._map_shared import SharedFile, Status
from zerowait.text_fields import parse_value

_MASK64 = (1 << 64) - 1


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
