"""Checkpoints that do not stall training and do not lie: ``zerowait.Checkpointer``.

``save()`` copies the state's tensors into a reused staging pool and returns; C++ writer threads
hash, write and fsync safetensors-compatible files, and the step becomes visible only once every
rank's part is durable (see docs/checkpoint.md for the layout and the commit protocol). This
module turns a nested state (dicts, lists, tuples of tensors, numpy arrays and plain values) into
a list of tensors plus a JSON description of the structure, coordinates ranks through
torch.distributed when it is initialised, and rebuilds the state on ``load()``.
"""

from __future__ import annotations

import base64
import collections
import collections.abc
import ctypes
import json
import math
import os
import pickle
import queue
import sys
import threading
import time
import warnings
import weakref
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from zerowait import _core
from zerowait.loader import _default_rank_world

# Describes the structure JSON stored in each rank's manifest; bump on incompatible change.
_STRUCTURE_FORMAT = "zerowait-state"
_STRUCTURE_VERSION = 1

# Safetensors names of the dtypes it knows. Any other dtype is stored as its raw bytes ("U8",
# shape [nbytes]), its real dtype and shape kept in the structure.
_TORCH_TO_SAFETENSORS = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3", "float8_e8m0fnu": "F8_E8M0", "int16": "I16", "uint16": "U16",
    "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32",
    "int64": "I64", "uint64": "U64", "float64": "F64", "complex64": "C64",
}
_NUMPY_TO_SAFETENSORS = {
    "|b1": "BOOL", "|u1": "U8", "|i1": "I8", "<i2": "I16", "<u2": "U16", "<f2": "F16",
    "<i4": "I32", "<u4": "U32", "<f4": "F32", "<i8": "I64", "<u8": "U64", "<f8": "F64",
    "<c8": "C64",
}
# Errors after which another copy of a step (the mirror) or an older step is worth trying; any
# other error is the caller's or a bug, and is raised at once.
_UNREADABLE = (_core.CorruptDataError, _core.ZerowaitNotFoundError, _core.ZerowaitIOError)


class SaveHandle:
    """A save in flight, returned by :meth:`Checkpointer.save`. Its background work goes on when
    the handle is dropped; :meth:`Checkpointer.wait` waits for every save."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    @property
    def step(self) -> int:
        return self._handle.step

    def done(self) -> bool:
        """Whether the save has finished (committed or failed)."""
        return self._handle.done()

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Waits until the save has finished and returns what it did: ``step``, ``committed``,
        ``bytes_total``, ``bytes_written``, ``tensors_written``, ``tensors_referenced``,
        ``snapshot_s``, ``write_s``, ``commit_s``. Raises the save's error, or TimeoutError when
        ``timeout`` seconds pass first (the save goes on)."""
        if timeout is not None:
            deadline = time.monotonic() + timeout
            while not self._handle.done():
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"checkpoint step {self.step} still saving after "
                                       f"{timeout} s")
                time.sleep(0.005)
        return self._handle.wait()

    def result(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """The same as :meth:`wait` (named like ``concurrent.futures.Future.result``)."""
        return self.wait(timeout)

    def __repr__(self) -> str:
        return f"<zerowait.SaveHandle step={self.step} done={self.done()}>"


class Checkpointer:
    """Asynchronous, atomic, verified checkpoints of a training state in ``directory``.

    ``state`` is a nested structure of dicts (str or int keys, order kept; OrderedDict stays
    OrderedDict), lists and tuples holding torch tensors (every dtype; views, non-contiguous,
    0-d, empty, CPU or CUDA), numpy arrays and scalars, and ``None``/bool/int/float/str/bytes.
    Anything else is a TypeError naming its key path, unless ``allow_pickle=True`` (then it is
    pickled; loading it needs ``allow_pickle=True`` too). Tensors are stored in
    safetensors-compatible files under their key path as an RFC 6901 JSON pointer
    (``/model/layer.0.weight``, ``/optimizer/state/0/exp_avg``).

    - ``keep_last``: keep the newest N committed steps (None: all); ``keep_every``: also keep
      every step that is a multiple of it.
    - ``mirror``: a second directory (e.g. a shared filesystem); each committed step is copied
      there in the background, and :meth:`load` uses it when the local copy is missing or corrupt.
    - ``compression``: None or ``"zstd"`` (byte-grouped for floating-point tensors).
    - ``max_file_bytes``: tensor files are cut at about this size (None: the engine's, 1 GiB);
      ``threads``: copy, write and read threads (0: one per CPU).
    - ``incremental``: write only the tensors whose bytes changed since the previous committed
      step and reference the rest; retention never deletes a file a kept step uses.
    - ``rank`` / ``world_size``: default to torch.distributed when it is initialised, else the
      RANK / WORLD_SIZE environment variables, else a single process. Every rank saves its own
      state into the same step, which is committed only when every rank's part is durable. With
      torch.distributed the ranks agree over a gloo group of their own (created here, so every
      rank must create its Checkpointer); without it they meet through files in the step's
      directory. ``commit_timeout`` (seconds) bounds how long a rank waits for the others.
    - ``allow_pickle``: pickle values that are none of the above, and unpickle them on load
      (only for checkpoints you trust).

    Not thread-safe: call save() and load() from one thread. Use as a context manager, or call
    :meth:`close`, so the last saves finish before the process ends (an open Checkpointer also
    waits for them at interpreter exit).
    """

    def __init__(
        self,
        directory: Any,
        keep_last: Optional[int] = None,
        keep_every: Optional[int] = None,
        mirror: Any = None,
        compression: Optional[str] = None,
        incremental: bool = False,
        *,
        max_file_bytes: Optional[int] = None,
        threads: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        allow_pickle: bool = False,
        commit_timeout: float = 600.0,
    ) -> None:
        if rank is None or world_size is None:
            default_rank, default_world = _default_rank_world()
            rank = default_rank if rank is None else rank
            world_size = default_world if world_size is None else world_size
        self.directory = os.fspath(directory)
        self.mirror = os.fspath(mirror) if mirror is not None else None
        self.rank = rank
        self.world_size = world_size
        self.allow_pickle = allow_pickle
        self.loaded_step: Optional[int] = None  # the step the last load() returned
        self._threads = threads
        dist = _initialised_distributed() if world_size > 1 else None
        if dist is not None and (rank, world_size) != (dist.get_rank(), dist.get_world_size()):
            raise ValueError(
                f"rank={rank}, world_size={world_size} differ from torch.distributed's "
                f"({dist.get_rank()}, {dist.get_world_size()})")
        sizes = {} if max_file_bytes is None else {"max_file_bytes": max_file_bytes}
        core = _core._Checkpointer(
            self.directory, keep_last=keep_last or 0, keep_every=keep_every or 0,
            mirror=self.mirror, compression=compression or "none", incremental=incremental,
            threads=threads, rank=rank, world_size=world_size,
            caller_coordinates=dist is not None, commit_timeout_s=commit_timeout, **sizes)
        self._core = core
        self._ranks = _RankCoordinator(core, dist, commit_timeout) if dist is not None else None
        self._last: Optional[SaveHandle] = None
        # Runs close() at interpreter exit if the caller did not: the last save completes, as
        # torch.save's would have, and no coordinator thread is left waiting.
        self._finalizer = weakref.finalize(self, _close, core, self._ranks)

    # --- saving --------------------------------------------------------------------------------

    def save(self, step: int, state: Any, blocking: bool = False,
             skip_if_busy: bool = False) -> Optional[SaveHandle]:
        """Snapshots ``state`` as step ``step`` and returns once its tensors are copied; writing,
        fsync and commit go on in the background. Waits for the previous save to finish first
        (backpressure: one save at a time owns the staging pool), or with ``skip_if_busy``
        returns None at once if it has not (on every rank alike under torch.distributed).
        ``blocking=True`` also waits for this save and raises its error. Raises TypeError,
        naming the key path, for a value that cannot be saved."""
        if not self._finalizer.alive:
            raise ValueError("save() on a closed Checkpointer")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, not {step!r}")
        if skip_if_busy:
            # Decided before the state is walked, which may copy non-contiguous tensors.
            busy = self._last is not None and not self._last.done()
            if self._ranks is not None:
                busy = self._ranks.any_over_ranks(busy)
                skip_if_busy = False  # every rank's previous save is done: nothing to wait for
            if busy:
                return None
        snapshot = _Snapshot(self.allow_pickle)
        structure = snapshot.encode_state(state)
        pending = self._core.begin_save(step, snapshot.tensors, structure, skip_if_busy)
        if pending is None:
            return None
        try:
            pending.copy_host_tensors()
            snapshot.copy_device_tensors(pending)
            handle = SaveHandle(pending.start())
        finally:
            # An unstarted save gives the staging pool back when dropped: now, not when the
            # traceback of an error goes.
            del pending
        del snapshot  # the staging copy is complete: the caller may change its tensors now
        if self._ranks is not None:
            self._ranks.submit(handle._handle)
        self._last = handle
        if blocking:
            handle.wait()
        return handle

    def wait(self) -> None:
        """Waits for every save and mirror copy in flight; raises the first error that no
        handle has reported."""
        self._core.wait_all()

    def close(self) -> None:
        """Waits for the saves in flight (raising as :meth:`wait`) and stops the coordinator."""
        if self._finalizer.alive:
            self._finalizer()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- listing -------------------------------------------------------------------------------

    def steps(self) -> List[int]:
        """The committed steps in ``directory``, ascending (data not verified)."""
        return _core._ckpt_list_steps(self.directory)

    def latest(self) -> Optional[int]:
        """The newest committed step in ``directory``, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    # --- loading -------------------------------------------------------------------------------

    def load(self, step: Optional[int] = None, map_location: Any = "cpu", into: Any = None,
             fallback: bool = True) -> Any:
        """This rank's part of step ``step`` (None: the newest committed step), rebuilt as it was
        saved, every tensor checksum-verified while it is read.

        Tensors are allocated on the CPU and read in place, then moved to ``map_location`` (a
        device or its name; None: the device each was saved from). With ``into`` (a state dict,
        or any nested structure like the saved one), each tensor or numpy array found at the same
        key path is filled in place instead (same dtype and shape, else ValueError) and appears
        in the result; tensors with no counterpart are allocated. If a read fails half-way, the
        ``into`` tensors hold a mix of old and new bytes.

        A copy that is missing or corrupt is replaced by the mirror's copy of the same step, and,
        with ``fallback`` and ``step=None``, by the newest older step that loads; each such
        fallback is a warning naming the file and tensor at fault. :attr:`loaded_step` says which
        step was returned. Under torch.distributed, ``load()`` with ``step=None`` is collective:
        every rank calls it, and all of them return the newest step that every rank could load.
        (Ranks coordinated through files fall back on their own: pass ``step`` to be sure.)
        """
        if step is not None or self._ranks is None:
            return self._load_newest_valid(step, map_location, into, fallback)
        try:
            state, mine = self._load_newest_valid(None, map_location, into, fallback), None
        except Exception as error:
            state, mine = None, error
        agreed = self._ranks.min_over_ranks(-1 if mine is not None else self.loaded_step)
        if mine is not None:
            raise mine
        if agreed < 0:
            raise _core.ZerowaitNotFoundError(
                f"another rank could not load any checkpoint from {self.directory} (see its "
                f"error); rank {self.rank} could load step {self.loaded_step}")
        if agreed != self.loaded_step:
            warnings.warn(f"rank {self.rank} loaded step {self.loaded_step}, but another rank "
                          f"could only load step {agreed}: loading step {agreed} so that every "
                          f"rank resumes from the same step", stacklevel=2)
            state = self._load_newest_valid(agreed, map_location, into, fallback)
        return state

    def _load_newest_valid(self, step: Optional[int], map_location: Any, into: Any,
                           fallback: bool) -> Any:
        """load() of one rank: step, its mirror copy, or with step=None older steps."""
        local = self.steps()
        mirrored = (_core._ckpt_list_steps(self.mirror)
                    if self.mirror is not None and os.path.isdir(self.mirror) else [])
        if step is not None:
            candidates = [step]
        else:
            candidates = sorted(set(local) | set(mirrored), reverse=True)
            if not fallback:
                candidates = candidates[:1]
            if not candidates:
                where = self.directory + (f" or its mirror {self.mirror}" if self.mirror else "")
                raise _core.ZerowaitNotFoundError(f"no committed checkpoint in {where}")
        # (step, root) in the order to try: each step's local copy, then its mirror copy.
        attempts = [(s, root) for s in candidates
                    for root, steps in ((self.directory, local), (self.mirror, mirrored))
                    if root is not None and (s in steps or step is not None)]
        for i, (s, root) in enumerate(attempts):
            if root == self.mirror and (s, self.directory) not in attempts:
                warnings.warn(f"checkpoint step {s} is not in {self.directory}; loading the "
                              f"mirror's copy in {self.mirror}", stacklevel=3)
            try:
                state = self._load_step(root, s, map_location, into)
            except _UNREADABLE as error:
                if i + 1 == len(attempts):
                    raise
                next_step, next_root = attempts[i + 1]
                then = (f"loading the mirror's copy in {next_root}" if next_step == s
                        else f"falling back to step {next_step}")
                warnings.warn(f"checkpoint step {s} in {root} cannot be loaded: {error}; {then}",
                              stacklevel=3)
                continue
            self.loaded_step = s
            return state
        raise AssertionError("unreachable")  # attempts is never empty

    def _load_step(self, root: str, step: int, map_location: Any, into: Any) -> Any:
        reader = _core._CheckpointReader(root, step, self.rank)
        manifest = reader.manifest()
        restore = _Restore(manifest, f"step {step} in {root}", self.allow_pickle)
        state = restore.decode_state(into)
        reader.read(restore.reads, threads=self._threads)
        return restore.finish(state, map_location)

    def __repr__(self) -> str:
        return (f"<zerowait.Checkpointer {self.directory!r} rank={self.rank} "
                f"world_size={self.world_size}>")


def _close(core: Any, ranks: Optional["_RankCoordinator"]) -> None:
    try:
        core.wait_all()
    finally:
        if ranks is not None:
            ranks.stop()


def _initialised_distributed() -> Any:
    """torch.distributed when it is initialised, else None (also when torch is absent)."""
    if "torch" not in sys.modules:  # a job that never imported torch has no process group
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


# --- ranks through torch.distributed -----------------------------------------------------------


class _RankCoordinator:
    """Commits each step once every rank's part is durable, agreeing over a gloo group of its
    own so that it never interleaves with the training job's collectives.

    One thread, owned by the Checkpointer, takes the saves in order: waits for this rank's part,
    all-gathers (step, ok, error) from every rank, lets rank 0 commit, broadcasts the outcome and
    hands it to the save. A rank that dies or stalls makes the collectives fail (at the latest
    after ``timeout`` seconds); the step is then not committed, and later saves fail at once,
    since the group's state is no longer known.
    """

    def __init__(self, core: Any, dist: Any, timeout: float) -> None:
        self._core = core
        self._dist = dist
        self._rank = dist.get_rank()
        self._world = dist.get_world_size()
        limit = timedelta(seconds=timeout)
        self._group = dist.new_group(backend="gloo", timeout=limit)
        # Collectives of the training thread (save's skip_if_busy, load's choice of step) may
        # run while the coordinator thread is inside one: they need a group of their own.
        self._main_group = dist.new_group(backend="gloo", timeout=limit)
        # Every rank's Checkpointer exists (rank 0 has removed orphaned .tmp steps) before any
        # rank writes.
        dist.barrier(group=self._group)
        self._broken: Optional[str] = None
        # begin_save() lets at most one save wait for its commit while the next one is staged.
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=2)
        # A daemon, yet never detached: close() or, at exit, the Checkpointer's finalizer stops
        # and joins it. (Python joins non-daemon threads before it runs finalizers.)
        self._thread = threading.Thread(target=self._run, name="zerowait-ckpt-commit",
                                        daemon=True)
        self._thread.start()

    def any_over_ranks(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (a collective of the training thread)."""
        return self.min_over_ranks(-int(flag)) < 0

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's ``value`` (a collective of the training thread)."""
        import torch

        tensor = torch.tensor([value], dtype=torch.int64)
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MIN, group=self._main_group)
        return int(tensor.item())

    def submit(self, handle: Any) -> None:
        self._queue.put(handle)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            handle = self._queue.get()
            if handle is None:
                return
            committed, why = False, "internal error in the commit coordinator"
            try:
                committed, why = self._agree(handle)
            finally:
                self._core.finish(handle, committed, why)

    def _agree(self, handle: Any) -> Tuple[bool, str]:
        step = handle.step
        try:
            handle.wait_part()
            mine = (step, True, "")
        except Exception as error:  # noqa: BLE001 - reported to every rank, then raised by wait()
            mine = (step, False, f"{type(error).__name__}: {error}")
        if self._broken is not None:
            return False, f"step {step} was not committed: {self._broken}"
        try:
            outcome: List[Any] = [False, ""]
            parts: List[Any] = [None] * self._world
            self._dist.all_gather_object(parts, mine, group=self._group)
            problems = [f"rank {r}: {message}" for r, (_, ok, message) in enumerate(parts)
                        if not ok]
            problems += [f"rank {r} saved step {s}, not {step}" for r, (s, _, _) in
                         enumerate(parts) if s != step]
            outcome = [False, "; ".join(problems)]
            if self._rank == 0 and not problems:
                try:
                    self._core.commit(step)
                    outcome = [True, ""]
                except Exception as error:  # noqa: BLE001 - every rank must learn of it
                    outcome = [False, f"rank 0 could not commit: {error}"]
            self._dist.broadcast_object_list(outcome, src=0, group=self._group)
        except Exception as error:  # noqa: BLE001 - a rank died or timed out
            self._broken = (f"the ranks lost contact at step {step} (a rank died or stalled); "
                            f"this Checkpointer commits no further step: {error}")
            if self._rank == 0 and outcome[0]:
                return True, ""  # committed before the others could be told: it is on disk
            return False, f"step {step} was not committed: {self._broken}"
        committed, why = outcome
        if not committed:
            why = f"step {step} was not committed: {why}"
        return committed, why


# --- state -> tensors + structure JSON ---------------------------------------------------------


def _int_node(value: int) -> Any:
    """An int as itself, or, beyond 64 bits (which the manifest's JSON parser turns into a
    double), as its decimal digits."""
    return value if -(1 << 63) <= value < (1 << 64) else {"type": "int", "value": str(value)}


def _path_text(path: Tuple[Any, ...]) -> str:
    """state["optimizer"]["param_groups"][0]: how a key path reads in errors."""
    return "state" + "".join(f"[{json.dumps(k) if isinstance(k, str) else k}]" for k in path)


def _json_pointer(path: Tuple[Any, ...]) -> str:
    """The RFC 6901 pointer of a key path: "/model/layer.0.weight"."""
    return "".join("/" + str(k).replace("~", "~0").replace("/", "~1") for k in path)


class _Snapshot:
    """Walks a state once: collects its tensors (what C++ stages) and describes the rest.

    Structure nodes are JSON: null, bools, 64-bit ints, finite floats and strings as themselves,
    the rest as objects tagged by "type": dict / odict (items as [key, value] pairs, so int keys
    stay ints), list, tuple, size (torch.Size), int (beyond 64 bits), float (non-finite),
    bytes / bytearray / pickle (base64), tensor and ndarray (index into the tensor list, dtype,
    shape; tensors also the device they came from, and whether they were Parameters).
    """

    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle
        self.tensors: List[tuple] = []  # what _Checkpointer.begin_save takes
        self._names: set = set()
        self._open: set = set()  # id() of the containers on the path being walked
        self._keep: List[Any] = []  # the arrays whose addresses are in self.tensors
        self._device: List[Tuple[int, Any]] = []  # (index, tensor) filled by the caller

    def encode_state(self, state: Any) -> str:
        root = self._encode(state, ())
        return json.dumps({"format": _STRUCTURE_FORMAT, "version": _STRUCTURE_VERSION,
                           "root": root}, allow_nan=False, separators=(",", ":"))

    def _encode(self, obj: Any, path: Tuple[Any, ...]) -> Any:
        kind = type(obj)
        if obj is None or kind in (bool, str):
            return obj
        if kind is int:
            return _int_node(obj)
        if kind is float:
            return obj if math.isfinite(obj) else {"type": "float", "value": repr(obj)}
        if kind in (bytes, bytearray):
            return {"type": kind.__name__, "data": base64.b64encode(obj).decode()}
        if kind in (dict, collections.OrderedDict, list, tuple):
            if id(obj) in self._open:
                raise TypeError(f"{_path_text(path)}: the state contains itself")
            self._open.add(id(obj))
            try:
                return self._container(obj, path)
            finally:
                self._open.discard(id(obj))
        if kind is np.ndarray or isinstance(obj, np.generic):
            return self._ndarray(obj, path)
        torch = sys.modules.get("torch")
        if torch is not None:
            if kind is torch.Size:
                return {"type": "size", "items": list(obj)}
            if kind in (torch.Tensor, torch.nn.Parameter):
                return self._tensor(torch, obj, path)
        return self._other(obj, path, "")

    def _container(self, obj: Any, path: Tuple[Any, ...]) -> Any:
        kind = type(obj)
        if kind in (list, tuple):
            return {"type": kind.__name__,
                    "items": [self._encode(v, path + (i,)) for i, v in enumerate(obj)]}
        items = []
        for key, value in obj.items():
            if type(key) not in (str, int):
                raise TypeError(f"{_path_text(path)}: cannot save a key of type "
                                f"'{type(key).__name__}' ({key!r}); keys must be str or int")
            items.append([_int_node(key) if type(key) is int else key,
                          self._encode(value, path + (key,))])
        node = {"type": "dict" if kind is dict else "odict", "items": items}
        metadata = getattr(obj, "_metadata", None)  # what nn.Module.state_dict() attaches
        if kind is not dict and metadata is not None:
            node["metadata"] = self._encode(metadata, path + ("_metadata",))
        return node

    def _other(self, obj: Any, path: Tuple[Any, ...], why: str) -> Any:
        what = why or f"an object of type '{type(obj).__name__}'"
        if not self.allow_pickle:
            raise TypeError(f"{_path_text(path)}: cannot save {what}; pass allow_pickle=True "
                            f"to pickle it")
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            raise TypeError(f"{_path_text(path)}: cannot pickle {what}: {error}") from error
        return {"type": "pickle", "data": base64.b64encode(data).decode()}

    def _add(self, path: Tuple[Any, ...], dtype: str, shape: List[int], element_size: int,
             floating: bool, address: int, nbytes: int, keep: Any) -> int:
        name = _json_pointer(path) or "/"  # the engine wants a name; "" would be the root
        if name in self._names:  # int key 0 and str key "0" of one dict share a pointer
            name += f"#{len(self.tensors)}"
        self._names.add(name)
        self._keep.append(keep)
        self.tensors.append((name, dtype, shape, element_size, floating, address, nbytes))
        return len(self.tensors) - 1

    def _tensor(self, torch: Any, tensor: Any, path: Tuple[Any, ...]) -> Any:
        t = tensor.detach()
        if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
            layout = "quantized" if t.is_quantized else str(t.layout).removeprefix("torch.")
            return self._other(tensor, path, f"a {layout} tensor on {t.device}")
        t = _contiguous(torch, t.resolve_conj().resolve_neg())
        dtype = str(t.dtype).removeprefix("torch.")
        nbytes = t.numel() * t.element_size()
        stored = _TORCH_TO_SAFETENSORS.get(dtype)
        # Byte grouping works on the floating-point numbers a complex number is made of.
        element = t.element_size() // (2 if t.dtype.is_complex else 1)
        floating = t.dtype.is_floating_point or t.dtype.is_complex
        on_host = _host_addressable(t)
        index = self._add(path, stored or "U8", list(t.shape) if stored else [nbytes], element,
                          floating, t.data_ptr() if on_host else 0, nbytes, t)
        if not on_host:
            self._device.append((index, t))
        node = {"type": "tensor", "index": index, "dtype": dtype, "shape": list(t.shape),
                "device": str(tensor.device)}
        if isinstance(tensor, torch.nn.Parameter):
            node["parameter"] = True
            node["requires_grad"] = tensor.requires_grad
        return node

    def _ndarray(self, value: Any, path: Tuple[Any, ...]) -> Any:
        array = np.asarray(value)
        # Object and structured dtypes, and dtypes registered by other libraries (ml_dtypes'
        # bfloat16 reads back as void), do not survive their dtype string.
        if array.dtype.hasobject or np.dtype(array.dtype.str) != array.dtype:
            return self._other(value, path, f"a numpy array of dtype {array.dtype}")
        stored_dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else None
        data = np.ascontiguousarray(array if stored_dtype is None else array.astype(stored_dtype))
        name = _NUMPY_TO_SAFETENSORS.get(data.dtype.str)
        floating = data.dtype.kind in "fc"
        element = data.dtype.itemsize // (2 if data.dtype.kind == "c" else 1)
        index = self._add(path, name or "U8", list(data.shape) if name else [data.nbytes],
                          element, floating, data.ctypes.data, data.nbytes, data)
        node = {"type": "ndarray", "index": index, "dtype": array.dtype.str,
                "shape": list(array.shape)}
        if isinstance(value, np.generic):
            node["scalar"] = True
        return node

    def copy_device_tensors(self, pending: Any) -> None:
        """Copies the tensors that are not in host memory into their staging bytes (pinned when
        CUDA is present), then waits for the copies: the caller may change its tensors after.

        GPU path: only test_checkpoint.py's CUDA test runs it on a GPU; on the CPU, a test runs
        it with CPU tensors."""
        if not self._device:
            return
        import torch

        for index, tensor in self._device:
            nbytes = self.tensors[index][6]
            if nbytes == 0:
                continue
            staging = (ctypes.c_uint8 * nbytes).from_address(pending.staging(index))
            host = torch.frombuffer(staging, dtype=torch.uint8)
            host.copy_(tensor.reshape(-1).view(torch.uint8), non_blocking=tensor.is_cuda)
        for device in {t.device for _, t in self._device if t.is_cuda}:
            torch.cuda.synchronize(device)


def _host_addressable(tensor: Any) -> bool:
    """Whether C++ can copy the tensor's bytes from its data_ptr() (else the caller copies them
    into staging: GPU tensors). A seam the tests use to run the GPU path on the CPU."""
    return tensor.device.type == "cpu"


def _contiguous(torch: Any, t: Any) -> Any:
    """t itself when contiguous, else a contiguous copy of its elements. Dtypes without a copy
    kernel (uint1..7, int1..7) are copied as same-sized integers."""
    if t.is_contiguous():
        return t
    try:
        return t.contiguous()
    except (RuntimeError, NotImplementedError):
        same_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        return t.view(same_size[t.element_size()]).contiguous().view(t.dtype)


# --- manifest + structure JSON -> state --------------------------------------------------------


class _Restore:
    """Rebuilds one rank's state from its manifest: allocates (or finds, in ``into``) every
    tensor, and lists the reads that fill them straight from the files."""

    def __init__(self, manifest: Dict[str, Any], what: str, allow_pickle: bool) -> None:
        self._tensors = manifest["tensors"]
        self._what = what
        self._allow_pickle = allow_pickle
        try:
            structure = json.loads(manifest["structure_json"])
            valid = structure.get("format") == _STRUCTURE_FORMAT
        except (ValueError, AttributeError):
            valid = False
        if not valid:
            raise _core.CorruptDataError(f"{what}: its manifest holds no zerowait state")
        if structure.get("version") != _STRUCTURE_VERSION:
            raise _core.UnsupportedError(f"{what}: state structure version "
                                         f"{structure.get('version')} is not {_STRUCTURE_VERSION}")
        self._root = structure["root"]
        self.reads: List[Tuple[int, int]] = []  # (manifest index, destination address)
        self._keep: List[Any] = []  # the destinations of self.reads
        self._copies: List[Tuple[Any, Any]] = []  # (target, read buffer) once the reads are done
        # (placeholder, build(placeholder, map_location)): values made from read bytes.
        self._after: List[Tuple[Any, Callable[[Any, Any], Any]]] = []

    def decode_state(self, into: Any) -> Any:
        """The state with every value that needs no bytes from the files; fills self.reads."""
        try:
            return self._decode(self._root, (), into)
        except (KeyError, IndexError, TypeError, AttributeError) as error:
            raise _core.CorruptDataError(f"{self._what}: malformed state structure in the "
                                         f"manifest ({type(error).__name__}: {error})") from error

    def finish(self, state: Any, map_location: Any) -> Any:
        """After the reads: copies into non-contiguous or device targets, then builds what could
        not exist before the bytes did (numpy scalars, tensors on map_location)."""
        if self._copies:
            import torch

            with torch.no_grad():
                for target, buffer in self._copies:
                    if isinstance(target, np.ndarray):
                        np.copyto(target, buffer)
                    else:
                        target.copy_(buffer)
        replaced = {}
        for placeholder, build in self._after:
            value = build(placeholder, map_location)
            if value is not placeholder:
                replaced[id(placeholder)] = value
        return _replace(state, replaced) if replaced else state

    def _decode(self, node: Any, path: Tuple[Any, ...], into: Any) -> Any:
        if not isinstance(node, dict):
            return node  # null, bool, int, finite float, str
        kind = node["type"]
        if kind in ("dict", "odict"):
            keys = [self._decode(k, path, None) for k, _ in node["items"]]
            pairs = [(k, self._decode(v, path + (k,), _child(into, k)))
                     for k, (_, v) in zip(keys, node["items"])]
            if kind == "dict":
                return dict(pairs)
            out = collections.OrderedDict(pairs)
            if "metadata" in node:
                out._metadata = self._decode(node["metadata"], path, None)  # type: ignore
            return out
        if kind in ("list", "tuple"):
            items = [self._decode(v, path + (i,), _child(into, i))
                     for i, v in enumerate(node["items"])]
            return items if kind == "list" else tuple(items)
        if kind == "float":
            return float(node["value"])
        if kind == "int":
            return int(node["value"])
        if kind in ("bytes", "bytearray"):
            data = base64.b64decode(node["data"])
            return data if kind == "bytes" else bytearray(data)
        if kind == "size":
            import torch

            return torch.Size(node["items"])
        if kind == "tensor":
            return self._tensor(node, path, into)
        if kind == "ndarray":
            return self._ndarray(node, path, into)
        if kind == "pickle":
            if not self._allow_pickle:
                raise ValueError(f"{self._what}: {_path_text(path)} was pickled; pass "
                                 f"allow_pickle=True to the Checkpointer to unpickle it (only "
                                 f"for checkpoints you trust)")
            return pickle.loads(base64.b64decode(node["data"]))
        raise _core.UnsupportedError(f"{self._what}: {_path_text(path)} has unknown type {kind!r}")

    def _stored(self, node: Dict[str, Any], path: Tuple[Any, ...], nbytes: int) -> int:
        index = node["index"]
        if not 0 <= index < len(self._tensors) or self._tensors[index]["nbytes"] != nbytes:
            raise _core.CorruptDataError(f"{self._what}: {_path_text(path)}: the manifest has no "
                                         f"tensor of {nbytes} bytes at index {index}")
        return index

    def _tensor(self, node: Dict[str, Any], path: Tuple[Any, ...], into: Any) -> Any:
        import torch

        dtype = getattr(torch, node["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise _core.UnsupportedError(f"{self._what}: {_path_text(path)} has dtype "
                                         f"{node['dtype']}, which this torch does not have")
        shape = tuple(node["shape"])
        target = None
        if into is not None:
            if not isinstance(into, torch.Tensor):
                raise ValueError(f"{_path_text(path)}: the checkpoint holds a tensor, but into= "
                                 f"holds {type(into).__name__}")
            if into.dtype != dtype or tuple(into.shape) != shape:
                raise ValueError(f"{_path_text(path)}: the checkpoint holds {node['dtype']} "
                                 f"{list(shape)}, but into= holds "
                                 f"{str(into.dtype).removeprefix('torch.')} {list(into.shape)}")
            target = into
        direct = (target is not None and target.device.type == "cpu" and target.is_contiguous()
                  and not target.is_conj() and not target.is_neg())
        buffer = target if direct else torch.empty(shape, dtype=dtype)
        index = self._stored(node, path, buffer.numel() * buffer.element_size())
        self._read(index, buffer.data_ptr(), buffer, fresh=buffer is not target)
        if target is not None:
            if not direct:
                self._copies.append((target, buffer))
            return target
        def to_device(tensor: Any, map_location: Any) -> Any:
            device = node["device"] if map_location is None else map_location
            if str(device) != "cpu":
                tensor = tensor.to(device)
            if node.get("parameter"):  # made here: a moved Parameter would be a plain tensor
                tensor = torch.nn.Parameter(tensor, requires_grad=node["requires_grad"])
            return tensor

        self._after.append((buffer, to_device))
        return buffer

    def _ndarray(self, node: Dict[str, Any], path: Tuple[Any, ...], into: Any) -> Any:
        dtype = np.dtype(node["dtype"])
        shape = tuple(node["shape"])
        stored = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
        if into is not None and not node.get("scalar"):
            if not isinstance(into, np.ndarray):
                raise ValueError(f"{_path_text(path)}: the checkpoint holds a numpy array, but "
                                 f"into= holds {type(into).__name__}")
            if into.dtype != dtype or into.shape != shape:
                raise ValueError(f"{_path_text(path)}: the checkpoint holds {dtype} "
                                 f"{list(shape)}, but into= holds {into.dtype} {list(into.shape)}")
            direct = into.flags.c_contiguous and into.flags.writeable and stored == dtype
            buffer = into if direct else np.empty(shape, stored)
            self._read(self._stored(node, path, buffer.nbytes), buffer.ctypes.data, buffer,
                       fresh=not direct)
            if not direct:
                self._copies.append((into, buffer))
            return into
        array = np.empty(shape, stored)
        self._read(self._stored(node, path, array.nbytes), array.ctypes.data, array, fresh=True)
        if stored != dtype or node.get("scalar"):
            def build(read: Any, _: Any) -> Any:
                value = read.astype(dtype) if stored != dtype else read
                return value[()] if node.get("scalar") else value

            self._after.append((array, build))
        return array

    def _read(self, index: int, address: int, keep: Any, fresh: bool) -> None:
        """Queues a read of tensor ``index`` to ``address``; ``fresh``: memory allocated for
        this load and not yet touched (the reader asks for huge pages there)."""
        if self._tensors[index]["nbytes"]:  # an empty tensor has nothing to read (and may be
            self.reads.append((index, address, fresh))  # at address 0)
            self._keep.append(keep)


def _child(into: Any, key: Any) -> Any:
    """into[key], or None when into has no such entry."""
    if not isinstance(into, (collections.abc.Mapping, list, tuple)):
        return None
    try:
        return into[key]
    except (KeyError, IndexError, TypeError):
        return None


def _replace(obj: Any, new: Dict[int, Any]) -> Any:
    """obj with every tensor whose id() is in ``new`` replaced, containers rebuilt alike."""
    if id(obj) in new:
        return new[id(obj)]
    if type(obj) in (dict, collections.OrderedDict):
        out = type(obj)((k, _replace(v, new)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_replace(v, new) for v in obj)
    return obj
