"""zerowait as the storage of torch.distributed.checkpoint: ``Writer`` and ``Reader``.

``dcp.save``, ``dcp.async_save`` and ``dcp.load`` (and what is built on them:
``get_state_dict``/``set_state_dict``, FSDP2 and tensor-parallel state) write and read an
ordinary zerowait step: every chunk checksummed and stored in pieces, committed across ranks only
once every rank's part is durable, mirrored, kept or retired by retention, listed and verified by
``zerowait ckpt``, on a local directory or an S3 prefix::

    import torch.distributed.checkpoint as dcp
    import zerowait.dcp

    dcp.save(state, storage_writer=zerowait.dcp.Writer("ckpt/", mirror="s3://bucket/run"))
    dcp.load(state, storage_reader=zerowait.dcp.Reader("ckpt/"))  # the newest committed step

DCP's protocol is the rendezvous: each rank's ``write_data`` writes its part and waits until it
is durable; DCP gathers the ranks' results on the coordinator, whose ``finish`` commits the step
(docs/checkpoint.md, "torch.distributed.checkpoint").
"""

from __future__ import annotations

import dataclasses
import io
import os
import uuid
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from zerowait import _core
from zerowait import _dcp_records as records
from zerowait._checkpoint_device import DeviceCopies
from zerowait._checkpoint_sharded import DEFAULT_PIECE_BYTES, ShardedLoad, ShardedSave
from zerowait._checkpoint_state import _json_pointer, _Snapshot

__all__ = ["Writer", "Reader"]

# Errors after which the mirror's copy of the same step is read instead.
_DAMAGE = (_core.CorruptDataError, _core.ZerowaitIOError, _core.ZerowaitNotFoundError,
           _core.DeadlineExceededError)


def _location(directory: Any, step: Optional[int]) -> Tuple[str, Optional[int]]:
    """(directory, step) of a Writer's or Reader's first argument and ``step``."""
    parsed_directory, parsed_step = records.parse_checkpoint_id(directory)
    if parsed_directory is None:
        raise TypeError(f"the directory must be a path or URL, not {directory!r}")
    if parsed_step is not None and step is not None and parsed_step != step:
        raise ValueError(f"{directory!r} names step {parsed_step}, but step={step}")
    return parsed_directory, step if step is not None else parsed_step


class _Location:
    """What a Writer and a Reader share: the directory, and the step a checkpoint_id names."""

    directory: str
    _step: Optional[int]

    def _reset_location(self, checkpoint_id: Any) -> None:
        if checkpoint_id is not None:
            directory, step = records.parse_checkpoint_id(checkpoint_id)
            self.directory = directory if directory is not None else self.directory
            self._step = step

    def _step_id(self, step: int) -> str:
        return f"{self.directory.rstrip('/')}/step-{step}"

    @property
    def checkpoint_id(self) -> str:
        """The step's directory (``DIR/step-N``), or DIR while the step is not chosen."""
        return self.directory.rstrip("/") if self._step is None else self._step_id(self._step)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        try:
            records.parse_checkpoint_id(checkpoint_id)
        except (TypeError, ValueError):
            return False
        return True


class _Engine:
    """The engine a Writer saves through, and the save whose outcome the engine has not been
    told yet. Owned by one Writer; its finalizer settles that save and waits for mirror copies."""

    def __init__(self) -> None:
        self.core: Any = None
        self.key: Any = None
        self.device = DeviceCopies()
        self.pending: Optional[Tuple[Any, int, str, str]] = None  # (handle, step, dir, run_id)

    def open(self, key: Tuple[str, int, int, str], options: Dict[str, Any]) -> Any:
        if self.core is None or self.key != key:
            self.close()
            directory, rank, world_size, run_id = key
            self.core = _core._Checkpointer(directory, rank=rank, world_size=world_size,
                                            caller_coordinates=True, run_id=run_id, **options)
            self.key = key
        return self.core

    def settle(self) -> None:
        """Tells the engine how the pending save ended, which DCP says only to the coordinator:
        committed when its step is in the directory. By the time this runs (the next save, or
        close) every rank's dcp.save has returned, so the coordinator's finish() is over."""
        if self.pending is None:
            return
        handle, step, directory, run_id = self.pending
        self.pending = None
        try:
            committed = _core._ckpt_step_info(directory, step)["run_id"] == run_id
        except _core.ZerowaitError:
            committed = False
        self.core.finish(handle, committed, f"step {step} was not committed: a rank failed "
                                            f"before the coordinator's finish()")
        try:
            handle.wait()
        except _core.ZerowaitError:
            pass  # dcp.save raised it on every rank already

    def close(self) -> None:
        self.settle()
        core, self.core, self.key = self.core, None, None
        if core is not None:
            core.wait_all()


class Writer(_Location, StorageWriter):
    """A ``StorageWriter`` saving each ``dcp.save`` / ``dcp.async_save`` as a zerowait step of
    ``directory`` (a local directory or ``s3://bucket/prefix``).

    The step: ``step=N``, or a ``checkpoint_id`` given to ``dcp.save`` (an int, or
    ``DIR/step-N``; zerowait's own step directory name); without one, the newest committed step
    plus one (0 in an empty directory), chosen by the coordinator. :attr:`saved_step` says
    which step the last save wrote. Options as :class:`zerowait.Checkpointer`'s: ``mirror``,
    ``keep_last``, ``keep_every``, ``compression``, ``incremental``, ``max_file_bytes``,
    ``threads``, ``run_id``, ``piece_bytes`` (every chunk is stored as pieces of this size, each
    with its own checksum: the unit a resharding load reads), ``allow_pickle`` (for
    ``planner_data`` that is not plain values).

    Every rank makes its own Writer; reuse it from save to save (the staging pool and the
    incremental base are kept). :meth:`close` (or ``with``) waits for mirror copies and raises
    their errors; a Writer not closed does that when it is collected.
    """

    def __init__(self, directory: Any, step: Optional[int] = None, *, mirror: Any = None,
                 keep_last: Optional[int] = None, keep_every: Optional[int] = None,
                 compression: Optional[str] = None, incremental: bool = False,
                 max_file_bytes: Optional[int] = None, threads: int = 0,
                 run_id: Optional[str] = None, piece_bytes: int = DEFAULT_PIECE_BYTES,
                 allow_pickle: bool = False) -> None:
        super().__init__()
        self.directory, self._step = _location(directory, step)
        ShardedSave(0, piece_bytes)  # refuses a bad piece_bytes now
        self._piece_bytes = piece_bytes
        self._allow_pickle = allow_pickle
        self._run_id = run_id or os.urandom(8).hex()
        options: Dict[str, Any] = dict(
            keep_last=keep_last or 0, keep_every=keep_every or 0,
            mirror=os.fspath(mirror) if mirror is not None else None,
            compression=compression or "none", incremental=incremental, threads=threads)
        if max_file_bytes is not None:
            options["max_file_bytes"] = max_file_bytes
        self._options = options
        self._setup()

    def _setup(self) -> None:
        """What is not pickled with the Writer (dcp.async_save's process mode sends it)."""
        self._engine = _Engine()
        self._finalizer = weakref.finalize(self, self._engine.close)
        self._rank = 0
        self._coordinator = True
        self._save_id = uuid.uuid4().hex
        self._record: Optional[Dict[str, Any]] = None
        self._plans: List[SavePlan] = []  # the last full global plan (DCP may cache plans)
        self.saved_step: Optional[int] = None

    def __getstate__(self) -> Dict[str, Any]:
        keep = ("directory", "_step", "_piece_bytes", "_allow_pickle", "_run_id", "_options")
        return {name: self.__dict__[name] for name in keep}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    # --- StorageWriter -------------------------------------------------------------------------

    def reset(self, checkpoint_id: Any = None) -> None:
        self._reset_location(checkpoint_id)
        self._save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("use_collectives", True):
            raise ValueError("zerowait.dcp.Writer commits a step once every rank's part is "
                             "durable: dcp.save(use_collectives=False) is not supported")
        self._coordinator = is_coordinator
        rank = kwargs.get("rank")
        if rank is None:  # a caller of the older signature: the coordinator is rank 0
            rank = 0 if is_coordinator else torch.distributed.get_rank()
        self._rank = rank

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        # A planner caching plans sends unchanged ones as unusable: this Writer kept them.
        if any(not p.usable for p in plans) and len(self._plans) != len(plans):
            raise RuntimeError("the planner sent cached plans this Writer has not seen: reuse "
                               "one Writer from save to save with enable_plan_caching")
        full = [p if p.usable else self._plans[i] for i, p in enumerate(plans)]
        self._plans = full
        engine = self._engine
        engine.settle()
        # Opened (the directory made) before any rank writes, since they wait for this plan:
        # the coordinator removes orphaned .tmp steps when it opens the directory.
        engine.open((self.directory, 0, len(plans), self._run_id), self._options)
        step = self._step
        if step is None:
            steps = _core._ckpt_list_steps(self.directory)
            step = steps[-1] + 1 if steps else 0
        self._record = records.global_record(full, self._piece_bytes, self._allow_pickle)
        target = {"step": step, "world_size": len(plans), "run_id": self._run_id}
        # Sent in full: a rank using its cached final plan would miss this save's step.
        return [dataclasses.replace(p, storage_data=dict(target), usable=True) for p in full]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        target = plan.storage_data
        if not isinstance(target, dict) or "step" not in target:
            raise RuntimeError("the plan lost zerowait's storage_data: the planner's finish_plan "
                               "must keep what the storage writer put in the plan")
        step, world_size = target["step"], target["world_size"]
        engine = self._engine
        if not self._coordinator:
            engine.settle()
        core = engine.open((self.directory, self._rank, world_size, target["run_id"]),
                           self._options)
        snapshot = _Snapshot(self._allow_pickle)
        pieces = ShardedSave(self._rank, self._piece_bytes)
        results, bytes_items = [], {}
        for item in plan.items:
            results.append(self._add_item(snapshot, pieces, item, planner, bytes_items))
        extra = {"save_id": self._save_id, "dcp_version": _dcp_version(),
                 "checkpoint_id": self._step_id(step)}
        record = self._record if self._coordinator else None
        structure = records.part_document(record, bytes_items, extra)
        pending = core.begin_save(step, snapshot.tensors, structure)
        try:
            engine.device.stage(snapshot.device_tensors, pending)
            pending.copy_host_tensors()
            handle = pending.start()
        finally:
            del pending  # an unstarted save gives the staging pool back now
        del snapshot
        engine.pending = (handle, step, self.directory, target["run_id"])
        handle.wait_part()  # this rank's part is durable: DCP may gather the results
        self.saved_step = step
        future: Future = Future()
        future.set_result(results)
        return future

    def _add_item(self, snapshot: Any, pieces: ShardedSave, item: Any, planner: SavePlanner,
                  bytes_items: Dict[str, Any]) -> WriteResult:
        fqn = item.index.fqn
        pointer = _json_pointer((fqn,))
        data = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            raw = data.getvalue()
            tensor = (torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw
                      else torch.empty(0, dtype=torch.uint8))
            # Read whole by the one rank that loads it: one stored tensor, one checksum.
            name = f"{pointer}~bytes"
            bytes_items[fqn] = {"nbytes": len(raw), "name": name}
            snapshot._add(name, "U8", [len(raw)], 1, False, tensor.data_ptr(), len(raw), tensor)
            return WriteResult(index=item.index, size_in_bytes=len(raw),
                               storage_data=self._rank)
        chunk = item.tensor_data.chunk
        tensor = data.detach()
        dtype = item.tensor_data.properties.dtype
        if tuple(tensor.shape) != tuple(chunk.sizes) or tensor.dtype != dtype:
            raise ValueError(f"{fqn}: the planner resolved a {records.dtype_name(tensor.dtype)} "
                             f"{list(tensor.shape)} tensor for a chunk of sizes "
                             f"{list(chunk.sizes)} and dtype {records.dtype_name(dtype)}")
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        names = records.piece_names(pointer, chunk.offsets, nbytes, self._piece_bytes)
        pieces.add_pieces(snapshot, tensor, names, tensor.element_size())
        return WriteResult(index=item.index, size_in_bytes=nbytes, storage_data=self._rank)

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        engine = self._engine
        if engine.pending is None or self._record is None:
            raise RuntimeError("finish() without this Writer's write_data() on the coordinator")
        handle, step = engine.pending[0], engine.pending[1]
        recorded = records.build_metadata(self._record, f"step {step}", self._allow_pickle)
        problems = records.metadata_differences(recorded, metadata)
        why = ""
        if problems:
            why = ("the planner's Metadata is not what its plans say (zerowait.dcp records the "
                   "plans' items and merged planner_data, as DefaultSavePlanner builds its "
                   "Metadata): " + "; ".join(problems[:5]))
        else:
            try:
                engine.core.commit(step)
            except _core.ZerowaitError as error:
                why = f"rank 0 could not commit step {step}: {error}"
        engine.pending = None
        engine.core.finish(handle, not why, why)
        if why:
            try:
                handle.wait()
            except _core.ZerowaitError:
                pass  # the error is `why`, raised below to every rank through DCP
            raise RuntimeError(why)
        handle.wait()
        metadata.storage_data = recorded.storage_data
        metadata.version = _dcp_version()
        metadata.storage_meta = StorageMeta(checkpoint_id=self._step_id(step),
                                            save_id=self._save_id)

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self._save_id)

    def close(self) -> None:
        """Settles the last save, waits for its mirror copy; raises a background error. The
        Writer may save again afterwards."""
        try:
            self._finalizer()
        finally:
            self._finalizer = weakref.finalize(self, self._engine.close)

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Reader(_Location, StorageReader):
    """A ``StorageReader`` of a step written through :class:`Writer`: ``step=N`` (or a
    ``checkpoint_id`` as the Writer takes), else the newest committed step of ``directory``.

    Each read item reads only the pieces of its stored chunk that hold the box it asks for
    (ranged reads, local or S3), each checked against its xxh3; a damaged piece is a
    ``CorruptDataError`` naming the file, the offset, and the piece (tensor and chunk:
    ``/model.w~chunk[6,0]~piece0``). With ``mirror``, the mirror's copy of the same step is read
    when the directory's copy is missing or damaged (a warning says why). ``threads``,
    ``direct_reads``, ``read_timeout`` and ``allow_pickle`` as :class:`zerowait.Checkpointer`'s.
    :attr:`loaded_step` says which step the last load read.
    """

    def __init__(self, directory: Any, step: Optional[int] = None, *, mirror: Any = None,
                 threads: int = 0, direct_reads: bool = True,
                 read_timeout: Optional[float] = None, allow_pickle: bool = False) -> None:
        super().__init__()
        self.directory, self._step = _location(directory, step)
        self.mirror = os.fspath(mirror) if mirror is not None else None
        self._read_options: Dict[str, Any] = dict(threads=threads, direct=direct_reads)
        if read_timeout is not None:
            self._read_options["read_timeout_s"] = read_timeout
        self._allow_pickle = allow_pickle
        self._load_id = uuid.uuid4().hex
        self.loaded_step: Optional[int] = None
        self._root = self.directory
        self._world_size = 1
        self._section: Dict[str, Any] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        self._reset_location(checkpoint_id)
        self._load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        step = self._step
        if step is None:
            steps = _core._ckpt_list_steps(self.directory)
            if not steps and self.mirror is not None:
                steps = _core._ckpt_list_steps(self.mirror)
            if not steps:
                raise _core.ZerowaitNotFoundError(f"no committed step in {self.directory}")
            step = steps[-1]

        def read(root: str) -> Tuple[Dict[str, Any], int, Metadata]:
            manifest = _core._CheckpointReader(root, step, 0).manifest()
            world_size = _core._ckpt_step_info(root, step)["world_size"]
            metadata = records.build_metadata(manifest["structure"], f"step {step} in {root}",
                                              self._allow_pickle)
            return manifest, world_size, metadata

        root, (manifest, world_size, metadata) = self._from_first_copy(
            [self.directory, self.mirror], step, read)
        where = f"step {step} in {root}"
        self._root, self._world_size = root, world_size
        self._section = records.dcp_section(manifest["structure"], where)
        self.loaded_step = step
        metadata.storage_meta.load_id = self._load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if self.loaded_step is None:
            raise RuntimeError("read_metadata() was not called on this Reader")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        tensors = [(item, planner.resolve_tensor(item).detach()) for item in plan.items
                   if item.type != LoadItemType.BYTE_IO]
        byte_items = [item for item in plan.items if item.type == LoadItemType.BYTE_IO]
        _, values = self._from_first_copy(
            [self._root, self.mirror], self.loaded_step,
            lambda root: self._read(root, tensors, byte_items))
        for item, target in tensors:
            planner.commit_tensor(item, target)
        for item, value in values:
            planner.load_bytes(item, io.BytesIO(value))
        future: Future = Future()
        future.set_result(None)
        return future

    @staticmethod
    def _from_first_copy(roots: List[Optional[str]], step: int, read: Any) -> Tuple[str, Any]:
        """(root, read(root)) for the first copy of the step in ``roots`` (None: no mirror, a
        root twice: once) that is neither missing nor damaged; a warning for each given up."""
        distinct = [r for i, r in enumerate(roots) if r is not None and r not in roots[:i]]
        for i, root in enumerate(distinct):
            try:
                return root, read(root)
            except _DAMAGE as error:
                if i + 1 == len(distinct):
                    raise
                warnings.warn(f"step {step} in {root} cannot be read: {error}; reading the "
                              f"mirror's copy in {distinct[i + 1]}", stacklevel=3)
        raise AssertionError("no copy to read")  # roots holds the directory

    def _read(self, root: str, tensors: List[Tuple[Any, Any]],
              byte_items: List[Any]) -> List[Tuple[Any, bytes]]:
        """Fills the tensors' targets from ``root``'s copy; returns the bytes items' values."""
        loader = ShardedLoad(root, self.loaded_step, self._world_size, self._read_options)
        for item, target in tensors:
            base = item.storage_index.offset
            offsets = tuple(b + o for b, o in zip(base, item.storage_offsets))
            loader.want(_json_pointer((item.storage_index.fqn,)), target, offsets,
                        tuple(item.lengths))
        loader.read()
        return [(item, self._read_bytes(root, item.storage_index.fqn)) for item in byte_items]

    def _read_bytes(self, root: str, fqn: str) -> bytes:
        rank = self._section["bytes_writers"][fqn]
        reader = _core._CheckpointReader(root, self.loaded_step, rank)
        manifest = reader.manifest()
        where = f"step {self.loaded_step} in {root}"
        entry = records.dcp_section(manifest["structure"], where)["bytes"][fqn]
        index = [i for i, t in enumerate(manifest["tensors"]) if t["name"] == entry["name"]]
        if len(index) != 1 or manifest["tensors"][index[0]]["nbytes"] != entry["nbytes"]:
            raise _core.CorruptDataError(f"{where}: rank {rank}'s manifest lacks {entry['name']} "
                                         f"({entry['nbytes']} bytes)")
        buffer = torch.empty(entry["nbytes"], dtype=torch.uint8)
        if entry["nbytes"]:
            reader.read([(index[0], buffer.data_ptr())], **self._read_options)
        return buffer.numpy().tobytes()


def _dcp_version() -> str:
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

    return CURRENT_DCP_VERSION
