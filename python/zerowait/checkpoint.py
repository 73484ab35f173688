"""Checkpoints that do not stall training and do not lie: ``zerowait.Checkpointer``.

``save()`` copies the state's tensors into a reused staging pool — those an optimizer owns after
it returns, guarded by ``_checkpoint_copy`` — and returns; C++ writer threads hash, write and
fsync safetensors-compatible files, and the step becomes visible only once every
rank's part is durable (see docs/checkpoint.md for the layout and the commit protocol). This
module turns a nested state (dicts, lists, tuples of tensors, numpy arrays and plain values) into
a list of tensors plus a JSON description of the structure, coordinates ranks through
torch.distributed when it is initialised, and rebuilds the state on ``load()``.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import warnings
import weakref
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

from zerowait import _checkpoint_copy, _core
from zerowait._checkpoint_device import DeviceCopies, StagedCopies
from zerowait._checkpoint_sharded import DEFAULT_PIECE_BYTES, ShardedLoad, ShardedSave
from zerowait._checkpoint_state import _Restore, _Snapshot
from zerowait.loader import _default_rank_world

class SaveHandle:
    """A save in flight, returned by :meth:`Checkpointer.save`. Its background work goes on when
    the handle is dropped; :meth:`Checkpointer.wait` waits for every save."""

    def __init__(self, handle: Any, device_copies: Optional[StagedCopies] = None,
                 copy: Optional[_checkpoint_copy.BackgroundCopy] = None) -> None:
        self._handle = handle
        self._device_copies = device_copies
        self._copy = copy

    @property
    def step(self) -> int:
        return self._handle.step

    def done(self) -> bool:
        """Whether the save has finished (committed or failed)."""
        if self._copy is not None:
            self._copy.settle(only_if_copied=True)
        return self._handle.done()

    def copied(self) -> bool:
        """Whether the snapshot is complete: every tensor of the state is copied (CUDA tensors:
        their copies are queued), so changing them no longer affects this save."""
        return self._handle.copied()

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Waits until the save has finished and returns what it did: ``step``, ``committed``,
        ``bytes_total``, ``bytes_written``, ``tensors_written``, ``tensors_referenced``,
        ``snapshot_s`` (the copy in save()), ``copy_s`` (the copy after it returned, in the
        background), ``copy_wait_s`` (how long the training loop waited for that copy: optimizer
        steps, the next save or load), ``write_s``, ``commit_s``; for CUDA tensors also ``device_bytes`` (copied
        from the GPU), ``device_copy_s`` (GPU time of those copies) and ``device_wait_s`` (how
        long the writer waited for them). Raises the save's error, or TimeoutError when
        ``timeout`` seconds pass first (the save goes on)."""
        if self._copy is not None:
            self._copy.settle()
        result = self._handle.wait(timeout)
        result["copy_wait_s"] = self._copy.wait_s if self._copy is not None else 0.0
        copies = self._device_copies
        # Done by now: the writer waited for them before it wrote.
        result["device_bytes"] = copies.bytes if copies is not None else 0
        result["device_copy_s"] = copies.seconds() if copies is not None else 0.0
        return result

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
      directory, and rank 0's Checkpointer starts a job: it commits only parts written for it,
      never a dead job's (a rank whose rank 0 another process replaced raises
      ``CancelledError``). ``commit_timeout`` (seconds) bounds how long a rank waits for the
      others.
    - ``allow_pickle``: pickle values that are none of the above, and unpickle them on load
      (only for checkpoints you trust).
    - ``direct_reads``: ``load()`` reads with O_DIRECT where the filesystem allows it, so a
      restore neither goes through nor evicts the page cache; False reads through it.
    - ``read_timeout``: seconds one read of ``load()`` (a span of at most 16 MiB) may take
      before it is abandoned and reported as ``DeadlineExceededError`` naming the file and
      offset, so a hung disk or mount never hangs the job (None: the engine's 60 s). A step
      that times out is treated like a damaged one: the mirror or an older step is tried.
    - ``run_id``: who saves, recorded with every step (:attr:`run_id`; None: random, the same on
      every rank under torch.distributed). A step number the mirror already holds from another
      run is refused (FileExistsError), never overwritten or skipped; :meth:`load` warns when it
      returns a step another run saved (except a resume: a Checkpointer that has saved nothing
      yet loading from its own directory) and sets :attr:`loaded_run_id`.
    - ``piece_bytes``: a sharded tensor's (``DTensor``'s) chunks are stored in pieces of this
      many bytes, each with its own checksum: the unit a resharding ``load()`` reads and
      verifies. Each chunk is written once, by the lowest rank holding it; ``load(into=...)``
      with DTensors of any mesh and placements (or plain tensors: the whole tensor) reads only
      the pieces overlapping each rank's target (docs/checkpoint.md, "Sharded state").
    - ``background_copy``: ``save()`` returns before the tensors that optimizers own (parameters
      and optimizer state: nearly all the bytes) are copied; the engine's threads copy them while
      the next forward and backward run, and any step of their optimizer waits until the copy is
      done, so the step saved is exactly the state at ``save()``. Other host tensors are copied
      before ``save()`` returns, and a tracked tensor changed in place by anything but an
      optimizer step before its copy is done fails that save, naming it (docs/checkpoint.md,
      "A save that never blocks"). False: ``save()`` copies every host tensor before it returns.

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
        direct_reads: bool = True,
        read_timeout: Optional[float] = None,
        run_id: Optional[str] = None,
        piece_bytes: int = DEFAULT_PIECE_BYTES,
        background_copy: bool = True,
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
        self.loaded_run_id: Optional[str] = None  # the run that saved it
        self._saved_any = False
        self._threads = threads
        self._direct_reads = direct_reads
        ShardedSave(rank, piece_bytes)  # refuses a bad piece_bytes now, not at the first save
        self._piece_bytes = piece_bytes
        if read_timeout is not None and not read_timeout > 0:
            raise ValueError(f"read_timeout must be a positive number of seconds or None, not "
                             f"{read_timeout!r}")
        self._read_timeout = {} if read_timeout is None else {"read_timeout_s": read_timeout}
        dist = _initialised_distributed() if world_size > 1 else None
        if dist is not None and (rank, world_size) != (dist.get_rank(), dist.get_world_size()):
            raise ValueError(
                f"rank={rank}, world_size={world_size} differ from torch.distributed's "
                f"({dist.get_rank()}, {dist.get_world_size()})")
        if run_id is None and dist is not None:
            shared = [os.urandom(8).hex() if rank == 0 else None]
            dist.broadcast_object_list(shared, src=0)
            run_id = shared[0]
        sizes = {} if max_file_bytes is None else {"max_file_bytes": max_file_bytes}
        core = _core._Checkpointer(
            self.directory, keep_last=keep_last or 0, keep_every=keep_every or 0,
            mirror=self.mirror, compression=compression or "none", incremental=incremental,
            threads=threads, rank=rank, world_size=world_size,
            caller_coordinates=dist is not None, commit_timeout_s=commit_timeout,
            run_id=run_id or "", **sizes)
        self._core = core
        self.run_id: str = core.run_id
        self._ranks = _RankCoordinator(core, dist, commit_timeout) if dist is not None else None
        self._last: Optional[SaveHandle] = None
        self._device = DeviceCopies()  # copy streams of the CUDA devices saved from or loaded to
        self._blocked_s = 0.0  # seconds save() held the caller, for StepProfiler and metrics
        self._saves = 0
        self._background_copy = background_copy
        # The save whose copy runs in the background, and the loop's waits for it elsewhere.
        self._copy_waits = _checkpoint_copy.CopyWaits()
        if background_copy and "torch" in sys.modules:
            _checkpoint_copy.install_step_hook(sys.modules["torch"])
        # Runs close() at interpreter exit if the caller did not: the last save completes, as
        # torch.save's would have, and no coordinator thread is left waiting.
        self._finalizer = weakref.finalize(self, _close, core, self._ranks, self._copy_waits)

    # --- saving --------------------------------------------------------------------------------

    def save(self, step: int, state: Any, blocking: bool = False,
             skip_if_busy: bool = False) -> Optional[SaveHandle]:
        """Snapshots ``state`` as step ``step`` and returns once its host tensors are copied
        (with ``background_copy``: those no optimizer owns; the rest are copied in the
        background, and their optimizer's next step waits for that) and the copies of its CUDA
        tensors are queued; writing, fsync and commit go on in the background. Waits for the previous save to finish first (backpressure: one save at a
        time owns the staging pool), or with ``skip_if_busy`` returns None at once if it has not
        (on every rank alike under torch.distributed). ``blocking=True`` also waits for this save
        and raises its error. Raises TypeError, naming the key path, for a value that cannot be
        saved. The time the call takes adds to :attr:`blocked_s`.

        CUDA tensors are copied into the staging pool (page-locked) on a copy stream per device
        that runs after the work already queued on the caller's current stream; save() does not
        wait for those copies. The caller's current stream waits for them instead: work queued
        after save() returns (an optimizer step changing the tensors in place) runs once they
        are done, so the snapshot is never torn, and the CPU never waits. Work on other streams
        that writes the tensors must wait for the current stream first (as torch requires for
        any cross-stream use)."""
        started = time.monotonic()
        try:
            return self._save(step, state, blocking, skip_if_busy)
        finally:
            self._blocked_s += time.monotonic() - started

    @property
    def blocked_s(self) -> float:
        """Seconds save() has held the caller in total (snapshot copies, waits for the previous
        save, ``blocking=True`` waits), plus the time optimizer steps and load() waited for a
        background copy: the training loop's checkpoint stall."""
        return self._blocked_s + self._copy_waits.blocked_s

    @property
    def saves(self) -> int:
        """Saves started (a save skipped by ``skip_if_busy`` is not one)."""
        return self._saves

    def _save(self, step: int, state: Any, blocking: bool,
              skip_if_busy: bool) -> Optional[SaveHandle]:
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
        # The previous save's writer publishes nothing before its copy is judged.
        self._copy_waits.settle()
        snapshot = _Snapshot(self.allow_pickle)
        snapshot.sharded = ShardedSave(self.rank, self._piece_bytes)
        torch = sys.modules.get("torch")
        if self._background_copy and torch is not None:
            _checkpoint_copy.install_step_hook(torch)
            snapshot.owned = _checkpoint_copy.owned_memory(torch)
        structure = snapshot.encode_state(state)
        pending = self._core.begin_save(step, snapshot.tensors, structure, skip_if_busy)
        if pending is None:
            return None
        try:
            # The GPU copies run while the CPU copies the host tensors.
            device_copies = self._device.stage(snapshot.device_tensors, pending)
            if snapshot.tracked:
                pending.copy_host_tensors(snapshot.copy_now)
                started = pending.start_copying()
                handle = SaveHandle(started, device_copies, _checkpoint_copy.BackgroundCopy(
                    started, step, [t[0] for t in snapshot.tensors], snapshot.tracked,
                    snapshot._keep, snapshot.owners, self._copy_waits))
            else:
                pending.copy_host_tensors()
                handle = SaveHandle(pending.start(), device_copies)
        finally:
            # An unstarted save gives the staging pool back when dropped (after its queued
            # device copies): now, not when the traceback of an error goes.
            del pending
        # Host tensors are in staging (or copied in the background, guarded) and device copies
        # ordered before the caller's next work: the caller may change its tensors now.
        del snapshot
        if self._ranks is not None:
            self._ranks.submit(handle._handle)
        self._last = handle
        self._saved_any = True
        self._saves += 1
        if blocking:
            handle.wait()
        return handle

    def wait(self) -> None:
        """Waits for every save and mirror copy in flight; raises the first error that no
        handle has reported."""
        self._copy_waits.settle()
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
             fallback: bool = True, mmap: bool = False) -> Any:
        """This rank's part of step ``step`` (None: the newest committed step), rebuilt as it was
        saved, every tensor checksum-verified while it is read.

        Tensors are allocated on ``map_location`` (a device or its name; None: the device each
        was saved from) and read in place: on the CPU straight from the files, on a CUDA device
        through a page-locked staging pool and asynchronous copies that overlap the next reads
        (load() returns once they are done). With ``into`` (a state dict,
        or any nested structure like the saved one), each tensor or numpy array found at the same
        key path is filled in place instead (same dtype and shape, else ValueError) and appears
        in the result; tensors with no counterpart are allocated. If a read fails half-way, the
        ``into`` tensors hold a mix of old and new bytes.

        ``mmap=True`` (for a checkpoint in a local directory) makes each new CPU tensor stored
        uncompressed a view of a private, copy-on-write mapping of its file instead of a copy:
        its pages are the page cache's, so a step the cache holds loads without copying and
        without a second copy in memory (``torch.load(mmap=True)`` and safetensors' ``load_file``
        do the same). Every tensor is still checksum-verified, by reading it where it is mapped.
        Writing to such a tensor copies the page written; the files are never changed. The
        files must not be truncated while the tensors live (zerowait never does: its gc
        unlinks), and pages the kernel evicts are read from the file again when next touched,
        without another verification. ``into`` targets, CUDA tensors, numpy arrays, compressed
        tensors and sharded (DTensor) states are read as without it.

        A copy that is missing or corrupt is replaced by the mirror's copy of the same step, and,
        with ``fallback`` and ``step=None``, by the newest older step that loads; each such
        fallback is a warning naming the file and tensor at fault. :attr:`loaded_step` says which
        step was returned. Under torch.distributed, ``load()`` with ``step=None`` is collective:
        every rank calls it, and all of them return the newest step that every rank could load.
        (Ranks coordinated through files fall back on their own: pass ``step`` to be sure.)
        """
        # A background copy may still read tensors that into= would overwrite.
        self._copy_waits.settle(blocking=True)
        if step is not None or self._ranks is None:
            return self._load_newest_valid(step, map_location, into, fallback, mmap)
        try:
            state, mine = self._load_newest_valid(None, map_location, into, fallback, mmap), None
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
            state = self._load_newest_valid(agreed, map_location, into, fallback, mmap)
        return state

    def _load_newest_valid(self, step: Optional[int], map_location: Any, into: Any,
                           fallback: bool, mmap: bool) -> Any:
        """load() of one rank: step, its mirror copy, or with step=None older steps. Which copy
        to read next, and when to give one up, is the engine's (restore_newest in C++, shared
        with ``zerowait ckpt restore``); this side builds the tensors and says what it skipped."""
        roots = {"primary": self.directory, "mirror": self.mirror}
        loaded: Dict[str, Any] = {}

        def plan(manifest: Dict[str, Any], s: int, tier: str,
                 local_root: Optional[str]) -> List[Tuple[int, int, bool, int, int, bool]]:
            restore = _Restore(manifest, f"step {s} in {roots[tier]}", self.allow_pickle,
                               map_location, self._device, local_root if mmap else None)
            loaded["run_id"] = manifest.get("run_id", "")
            restore.sharded = ShardedLoad(roots[tier], s, manifest["world_size"], dict(
                threads=self._threads, direct=self._direct_reads, **self._read_timeout))
            loaded["state"] = restore.decode_state(into)
            restore.sharded.read()
            loaded["restore"] = restore
            return restore.reads

        def on_skip(s: int, tier: str, listed: bool, error: str, next_step: int,
                    next_tier: str) -> None:
            # stacklevel 4: on_skip, _load_newest_valid, load, the caller.
            if not listed:
                warnings.warn(f"checkpoint step {s} is not in {self.directory}; loading the "
                              f"mirror's copy in {self.mirror}", stacklevel=4)
                return
            then = (f"loading the mirror's copy in {roots[next_tier]}" if next_step == s
                    else f"falling back to step {next_step}")
            warnings.warn(f"checkpoint step {s} in {roots[tier]} cannot be loaded: {error}; "
                          f"{then}", stacklevel=4)

        result = _core._ckpt_restore_newest(
            self.directory, self.mirror, step, self._part_rank(step), fallback, plan, on_skip,
            threads=self._threads, direct=self._direct_reads, **self._read_timeout)
        self.loaded_step = result["step"]
        state = loaded["restore"].finish(loaded["state"])
        saver = loaded["run_id"]
        resuming = not self._saved_any and result["tier"] == "primary"
        if saver != self.run_id and not resuming:
            # stacklevel 3: _load_newest_valid, load, the caller.
            warnings.warn(f"checkpoint step {self.loaded_step} in {roots[result['tier']]} was "
                          f"saved by run {saver or '(unrecorded)'}, not by this run "
                          f"({self.run_id})", stacklevel=3)
        self.loaded_run_id = saver
        return state

    def _part_rank(self, step: Optional[int]) -> int:
        """The rank whose part load() reads: this rank's; rank 0's for a rank beyond the world
        size that saved the step when that was one process, or when the step holds sharded
        tensors (restoring onto more ranks): such a rank gets rank 0's per-rank values."""
        chosen = self.latest() if step is None else step
        if chosen is None or self.rank == 0:
            return self.rank
        try:
            saved_world = _core._ckpt_step_info(self.directory, chosen)["world_size"]
            if self.rank < saved_world:
                return self.rank
            if saved_world == 1:
                return 0
            structure = _core._CheckpointReader(self.directory, chosen, 0).manifest()["structure"]
        except (_core.ZerowaitError, KeyError, TypeError):
            return self.rank  # load() reports what is wrong with the step
        return 0 if isinstance(structure, dict) and "sharded" in structure else self.rank

    def __repr__(self) -> str:
        return (f"<zerowait.Checkpointer {self.directory!r} rank={self.rank} "
                f"world_size={self.world_size}>")


def _close(core: Any, ranks: Optional["_RankCoordinator"],
           copy_waits: _checkpoint_copy.CopyWaits) -> None:
    try:
        copy_waits.settle()
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
        # The next begin_save() waits until this thread has finished the previous save, so at
        # most one save waits here at a time.
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
        every_part_in = False  # known on this rank: then only rank 0 knows the outcome
        try:
            outcome: List[Any] = [False, ""]
            parts: List[Any] = [None] * self._world
            self._dist.all_gather_object(parts, mine, group=self._group)
            problems = [f"rank {r}: {message}" for r, (_, ok, message) in enumerate(parts)
                        if not ok]
            problems += [f"rank {r} saved step {s}, not {step}" for r, (s, _, _) in
                         enumerate(parts) if s != step]
            every_part_in = not problems
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
            if self._rank != 0 and every_part_in:
                # Rank 0 had what it needed and may have committed before contact was lost.
                return False, (f"step {step} may or may not be committed: every rank's part was "
                               f"in, and rank {self._rank} lost contact before rank 0's outcome "
                               f"came (`zerowait ckpt ls` or load() tells): {self._broken}")
            return False, f"step {step} was not committed: {self._broken}"
        committed, why = outcome
        if not committed:
            why = f"step {step} was not committed: {why}"
        return committed, why
