"""Sharded tensors in ``zerowait.Checkpointer`` steps: each chunk saved once, restored onto any
placement.

A ``DTensor`` (FSDP2's ``Shard(0)``, tensor parallelism's ``Shard(1)``/``Shard(0)``, HSDP's 2-D
mesh, ``Replicate``) is saved as the chunks its mesh splits it into. Every rank works out the
same list of distinct chunks from the global shape, the mesh and the placements, without any
communication; a chunk is written by the lowest rank holding it (so a replicated tensor is
written once), cut into pieces of ``piece_bytes`` that the engine stores, hashes and verifies as
tensors of their own. A ``ShardedTensor`` (older FSDP's) is saved alike from the shards its
metadata lists, each written by the rank it is placed on. The lowest rank of the mesh records
the tensor's global entry (global shape, dtype, and each chunk's offsets, sizes, rank and piece
names) in the ``sharded`` section of its rank manifest, which the step's commit record
checksums: the entry is committed with the step or not at all. The rank manifest holding a piece
says where it lives (file, offset, stored bytes, xxh3).

``ShardedLoad`` restores onto the caller's targets: a ``DTensor`` with any mesh and placements,
a ``ShardedTensor`` (its local shards), a plain tensor (the whole tensor), or nothing (a new
full tensor). For each saved chunk that overlaps the target's box it reads only the pieces
holding overlapping elements, through the store's ranged reads, each verified against its
checksum: straight into the target where the overlap is one run of bytes in both the chunk and a
contiguous host target (FSDP2's rows), else into a buffer from which the overlap is copied. The
reads of the pieces saved by different ranks run at once.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

from zerowait import _checkpoint_device as _device
from zerowait import _core

# Pieces a chunk is cut into: the unit of a ranged read and of its verification.
DEFAULT_PIECE_BYTES = 4 << 20
_SECTION_VERSION = 1
# Saved ranks whose pieces a restore reads at once (each read call starts its own threads).
_RANKS_READ_AT_ONCE = 4


def _loaded_class(module: str, name: str) -> Any:
    """A class of a torch module when that module is loaded (a state holding one of its objects
    has loaded it), else None: checking a value never imports torch.distributed."""
    return getattr(sys.modules.get(module), name, None)


def is_dtensor(obj: Any) -> bool:
    cls = _loaded_class("torch.distributed.tensor", "DTensor")
    return cls is not None and isinstance(obj, cls)


def is_sharded_tensor(obj: Any) -> bool:
    """Older FSDP's and torchrec's ShardedTensor."""
    cls = _loaded_class("torch.distributed._shard.sharded_tensor.api", "ShardedTensor")
    return cls is not None and isinstance(obj, cls)


def is_sharded(obj: Any) -> bool:
    return is_dtensor(obj) or is_sharded_tensor(obj)


Box = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (offsets, sizes) in the global tensor


Chunk = Tuple[Tuple[int, ...], Tuple[int, ...], int]  # (offsets, sizes, writer rank)


def _layout(obj: Any, what: Callable[[], str]) -> Tuple[
        Tuple[Chunk, ...], List[Tuple[Any, Tuple[int, ...], Tuple[int, ...]]], int]:
    """(every distinct non-empty chunk as (offsets, sizes, writer rank) ordered by offsets, this
    rank's local chunks as (tensor, offsets, sizes), the rank that records the global entry).
    ``what()`` names the tensor in errors."""
    if is_dtensor(obj):
        chunks, box, recorder = _dtensor_layout(obj, what)
        return chunks, [(_local_tensor(obj), *box)] if box is not None else [], recorder
    import torch.distributed as dist

    group = getattr(obj, "_process_group", None)
    chunks = tuple(sorted((tuple(m.shard_offsets), tuple(m.shard_sizes),
                           m.placement.rank() if group is None
                           else dist.get_global_rank(group, m.placement.rank()))
                          for m in obj.metadata().shards_metadata if math.prod(m.shard_sizes)))
    local = [(s.tensor, tuple(s.metadata.shard_offsets), tuple(s.metadata.shard_sizes))
             for s in obj.local_shards()]
    return chunks, local, min((c[2] for c in chunks), default=-1)


# A DTensor's layout depends only on its mesh, placements and global shape, which a training job
# keeps from save to save; computing it (the mesh's rank tensor, every coordinate's box) was most
# of save()'s return: 30 of 34 ms for 48 DTensors. Bounded: cleared when it grows past this.
_LAYOUTS: Dict[Tuple[Any, ...], Tuple[Tuple[Chunk, ...], Optional[Box], int]] = {}
_LAYOUTS_MAX = 65536


# What encode() makes of a sharded tensor from its key, dtype, shape and chunks (its global entry
# as JSON, the names of the pieces this rank writes), which a training job keeps from save to
# save: made once, not at every save().
_ENTRIES: Dict[Tuple[Any, ...], Tuple[str, Dict[str, Any], List[Tuple[Any, List[str]]]]] = {}
_ENTRIES_MAX = 65536


def _local_tensor(dtensor: Any) -> Any:
    """A DTensor's local shard: the tensor it holds (what ``to_local()`` returns a view of,
    through an autograd function costing more than the rest of its save)."""
    local = getattr(dtensor, "_local_tensor", None)
    return local if local is not None else dtensor.to_local()


def _dtensor_layout(dtensor: Any, what: Callable[[], str]) -> Tuple[
        Tuple[Chunk, ...], Optional[Box], int]:
    """(every distinct chunk as _chunks gives them, this rank's box, the recording rank)."""
    mesh = dtensor.device_mesh
    key = (mesh, tuple(dtensor.placements), tuple(dtensor.shape))
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = (_chunks(dtensor, what), _local_box(dtensor), int(mesh.mesh.min()))
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    return layout


def target_boxes(into: Any) -> List[Tuple[Any, Tuple[int, ...], Tuple[int, ...]]]:
    """The parts of a load target this rank fills: (local tensor, offsets, sizes)."""
    if is_dtensor(into):
        box = _local_box(into)
        return [(into.to_local(), *box)] if box is not None else []
    if is_sharded_tensor(into):
        return [(s.tensor, tuple(s.metadata.shard_offsets), tuple(s.metadata.shard_sizes))
                for s in into.local_shards()]
    return [(into, (0,) * into.dim(), tuple(into.shape))]


def _chunks(dtensor: Any, what: Callable[[], str]) -> Tuple[Chunk, ...]:
    """Every distinct non-empty chunk of ``dtensor`` as (offsets, sizes, writer rank), ordered by
    offsets; the writer is the lowest global rank holding that chunk."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    placements = list(dtensor.placements)
    for placement in placements:
        if placement.is_partial():
            raise TypeError(f"{what()}: a DTensor with a Partial placement holds unreduced values; "
                            f"call .redistribute() to Shard or Replicate before saving it")
    ranks = dtensor.device_mesh.mesh
    writers: Dict[Tuple[Tuple[int, ...], Tuple[int, ...]], int] = {}
    for coordinate in itertools.product(*(range(n) for n in ranks.shape)):
        sizes, offsets = _compute_local_shape_and_global_offset(
            tuple(dtensor.shape), tuple(ranks.shape), list(coordinate), placements)
        if math.prod(sizes) == 0:
            continue
        key = (tuple(offsets), tuple(sizes))
        rank = int(ranks[coordinate])
        writers[key] = min(writers.get(key, rank), rank)
    return tuple((offsets, sizes, rank) for (offsets, sizes), rank in sorted(writers.items()))


def _local_box(dtensor: Any) -> Optional[Box]:
    """(offsets, sizes) of this rank's chunk of ``dtensor``; None when its mesh lacks this rank."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if dtensor.device_mesh.get_coordinate() is None:
        return None
    sizes, offsets = compute_local_shape_and_global_offset(
        dtensor.shape, dtensor.device_mesh, dtensor.placements)
    return tuple(offsets), tuple(sizes)


class ShardedSave:
    """The save side, attached to a ``_Snapshot``: encodes each DTensor or ShardedTensor as a
    ``sharded`` node,
    adds the pieces of the chunks this rank writes, and collects the global entries this rank
    records."""

    def __init__(self, rank: int, piece_bytes: int) -> None:
        if piece_bytes <= 0 or piece_bytes % 16:
            raise ValueError(f"piece_bytes must be a positive multiple of 16, not {piece_bytes}")
        self.rank = rank
        self.piece_bytes = piece_bytes
        self.used = False  # the state held a sharded tensor
        self._entries: Dict[str, str] = {}  # the global entries this rank records, as JSON

    def section_json(self) -> str:
        """The ``sharded`` section of this rank's structure document, as JSON."""
        tensors = ",".join(f"{json.dumps(key)}:{text}" for key, text in self._entries.items())
        return f'{{"version":{_SECTION_VERSION},"tensors":{{{tensors}}}}}'

    def encode(self, snapshot: Any, tensor: Any, pointer: str,
               what: Callable[[], str]) -> Dict[str, Any]:
        self.used = True
        chunks, local, recorder = _layout(tensor, what)
        key = (pointer, tensor.dtype, tuple(tensor.shape), chunks, self.rank, self.piece_bytes)
        made = _ENTRIES.get(key)
        if made is None:
            made = self._entry(pointer, tensor, chunks)
            if len(_ENTRIES) >= _ENTRIES_MAX:
                _ENTRIES.clear()
            _ENTRIES[key] = made
        text, entry, written = made
        if written:
            mine = {(offsets, sizes): t for t, offsets, sizes in local}
            for box, names in written:
                if box in mine:
                    self.add_pieces(snapshot, _device_contiguous(mine[box].detach()), names,
                                    entry["element_size"], tensor if is_dtensor(tensor) else None)
        if recorder == self.rank:
            self._entries[pointer] = text
        return {"type": "sharded", "key": pointer, "dtype": entry["dtype"],
                "shape": list(entry["shape"]), "device": str(tensor.device)}

    def _entry(self, pointer: str, tensor: Any, chunks: Tuple[Chunk, ...]) -> Tuple[
            str, Dict[str, Any], List[Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], List[str]]]]:
        """(the tensor's global entry as JSON, the entry, the (offsets, sizes) and piece names of
        the chunks this rank writes)."""
        element = tensor.dtype.itemsize
        entry = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                 "element_size": element, "chunks": []}
        written = []
        for j, (offsets, sizes, writer) in enumerate(chunks):
            nbytes = math.prod(sizes) * element
            names = [f"{pointer}~chunk{j}~piece{k}"
                     for k in range(-(-nbytes // self.piece_bytes))]
            entry["chunks"].append({"offsets": list(offsets), "sizes": list(sizes),
                                    "rank": writer, "nbytes": nbytes,
                                    "piece_bytes": self.piece_bytes, "pieces": names})
            if writer == self.rank:
                written.append(((offsets, sizes), names))
        return json.dumps(entry, separators=(",", ":")), entry, written

    def add_pieces(self, snapshot: Any, local: Any, names: List[str], element: int,
                   holder: Any = None) -> None:
        """Adds the bytes of contiguous ``local`` to the save as the pieces ``names``;
        ``holder``: the DTensor whose shard it is (snapshot.add_pieces)."""
        floating = local.dtype.is_floating_point or local.dtype.is_complex
        grouping = element // (2 if local.dtype.is_complex else 1)
        if _device._host_addressable(local):
            snapshot.add_pieces(names, grouping, floating, local, self.piece_bytes, holder)
            return
        import torch

        data = local.reshape(-1).view(torch.uint8)
        for k, name in enumerate(names):
            piece = data[k * self.piece_bytes:(k + 1) * self.piece_bytes]
            nbytes = piece.numel()
            index = snapshot._add(name, "U8", [nbytes], grouping, floating, 0, nbytes, piece,
                                  piece)
            snapshot.device_tensors.append((index, piece, nbytes))


def _device_contiguous(t: Any) -> Any:
    return t if t.is_contiguous() else t.contiguous()


# --- restoring -----------------------------------------------------------------------------------


def _pieces(sizes: Tuple[int, ...], lo: List[int], hi: List[int], element: int,
            piece_bytes: int) -> List[int]:
    """The pieces of a chunk of shape ``sizes`` that hold elements of the box [lo, hi)."""
    import torch

    count = -(-math.prod(sizes) * element // piece_bytes)
    if not sizes:
        return list(range(count))
    strides = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
    # The box is a set of runs of consecutive elements: the innermost dimensions it covers
    # whole, plus the next one's range.
    k = len(sizes) - 1
    while k > 0 and lo[k] == 0 and hi[k] == sizes[k]:
        k -= 1
    run = (hi[k] - lo[k]) * strides[k]
    starts = torch.tensor([lo[k] * strides[k]], dtype=torch.int64)
    for d in reversed(range(k)):
        rows = torch.arange(lo[d], hi[d], dtype=torch.int64) * strides[d]
        starts = (rows[:, None] + starts[None, :]).reshape(-1)
    first = starts * element // piece_bytes
    last = ((starts + run) * element - 1) // piece_bytes
    marks = torch.zeros(count + 1, dtype=torch.int64)
    marks.index_add_(0, first, torch.ones_like(first))
    marks.index_add_(0, last + 1, -torch.ones_like(last))
    return torch.nonzero(marks.cumsum(0)[:count] > 0).flatten().tolist()


def _run(shape: Tuple[int, ...], lo: List[int], hi: List[int]) -> Optional[Tuple[int, int]]:
    """(first element, element count) of the box [lo, hi) of a C-contiguous array of ``shape``
    when its elements are one run of consecutive elements, else None."""
    k = len(shape) - 1
    while k > 0 and lo[k] == 0 and hi[k] == shape[k]:
        k -= 1
    if any(hi[d] - lo[d] != 1 for d in range(k)):
        return None
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    return (sum(a * s for a, s in zip(lo, strides)),
            math.prod(b - a for a, b in zip(lo, hi)))


def _read_in_place(target: Any, target_start: int, begin: int, end: int, nbytes: int,
                   piece_bytes: int, pieces: Dict[int, int], keep: List[Any]) -> Tuple[
                       List[Tuple[int, int]], List[Tuple[Any, List[slice], Any, List[slice]]]]:
    """The reads (manifest index, address) that put bytes [begin, end) of a chunk of ``nbytes``
    into the contiguous ``target`` at byte ``target_start``, and the copies they need: a piece
    (``pieces``: piece number -> manifest index) inside the run is read straight there, one the
    run's ends cut through into a buffer of its own, copied from."""
    import torch

    base = target.data_ptr() + target_start
    reads, copies = [], []
    for k, index in pieces.items():
        first, last = k * piece_bytes, min((k + 1) * piece_bytes, nbytes)
        if begin <= first and last <= end:
            reads.append((index, base + first - begin))
            continue
        buffer = torch.empty(last - first, dtype=torch.uint8)
        keep.append(buffer)
        reads.append((index, buffer.data_ptr()))
        lo, hi = max(begin, first), min(end, last)
        into = target.reshape(-1).view(torch.uint8)
        at = target_start + lo - begin
        copies.append((into, [slice(at, at + hi - lo)], buffer, [slice(lo - first, hi - first)]))
    return reads, copies


class ShardedLoad:
    """The restore side: ``decode`` (called by ``_Restore`` for each ``sharded`` node) picks the
    target, ``read`` reads the overlapping pieces of every rank's part of the step at ``root``."""

    def __init__(self, root: str, step: int, world_size: int, read_options: Dict[str, Any]) -> None:
        self._root = root
        self._step = step
        self._world_size = world_size
        self._options = read_options
        self._readers: Dict[int, Any] = {}
        self._manifests: Dict[int, Dict[str, Any]] = {}
        # (pointer, target's local tensor, box offsets, box sizes)
        self._wanted: List[Tuple[str, str, Any, Tuple[int, ...], Tuple[int, ...]]] = []

    def decode(self, node: Dict[str, Any], dtype: Any, into: Any, map_location: Any) -> Any:
        """The value of a ``sharded`` node: ``into`` (checked by the caller to have its dtype and
        global shape) filled where it is this rank's, or a new full tensor."""
        import torch

        shape = tuple(node["shape"])
        if into is None:
            location = node["device"] if map_location is None else map_location
            full = torch.empty(shape, dtype=dtype, device=location)
            self._wanted.append((node["key"], full, (0,) * len(shape), shape))
            return full
        self._wanted += [(node["key"], *box) for box in target_boxes(into)]
        return into

    def want(self, pointer: str, target: Any, offsets: Tuple[int, ...],
             sizes: Tuple[int, ...]) -> None:
        """Fills ``target`` (a tensor of shape ``sizes``) with the box of sharded tensor
        ``pointer`` at ``offsets`` when read() runs (zerowait.dcp's read items)."""
        self._wanted.append((pointer, target, tuple(offsets), tuple(sizes)))

    def _manifest(self, rank: int) -> Dict[str, Any]:
        if rank not in self._manifests:
            self._readers[rank] = _core._CheckpointReader(self._root, self._step, rank)
            self._manifests[rank] = self._readers[rank].manifest()
        return self._manifests[rank]

    def _entry(self, pointer: str) -> Optional[Dict[str, Any]]:
        """The global entry of ``pointer``: in rank 0's manifest for a mesh over every rank, so
        the other ranks' manifests are read (in rank order) only for tensors of other meshes
        (pipeline stages) and for the pieces a restore needs."""
        for rank in range(self._world_size):
            structure = self._manifest(rank).get("structure") or {}
            entry = (structure.get("sharded") or {}).get("tensors", {}).get(pointer)
            if entry is not None:
                return entry
        return None

    def read(self) -> None:
        """Reads every target's overlapping pieces (verified) and puts the overlaps in place."""
        if not self._wanted:
            return  # no sharded tensor: no need to import torch
        import torch

        where = f"step {self._step} in {self._root}"
        reads: Dict[int, List[Tuple[int, int]]] = {}
        copies = []
        keep = []
        for pointer, target, offsets, sizes in self._wanted:
            entry = self._entry(pointer)
            if entry is None:
                raise _core.CorruptDataError(f"{where}: no rank manifest records the chunks of "
                                             f"sharded tensor {pointer}")
            dtype = getattr(torch, entry["dtype"])
            element = entry["element_size"]
            for chunk in entry["chunks"]:
                lo = [max(o, c) for o, c in zip(offsets, chunk["offsets"])]
                hi = [min(o + s, c + n) for o, s, c, n in
                      zip(offsets, sizes, chunk["offsets"], chunk["sizes"])]
                if any(a >= b for a, b in zip(lo, hi)):
                    continue
                rank, piece_bytes = chunk["rank"], chunk["piece_bytes"]
                local_lo = [a - c for a, c in zip(lo, chunk["offsets"])]
                local_hi = [b - c for b, c in zip(hi, chunk["offsets"])]
                index = self._piece_index(rank, where)
                pieces = {}  # piece number -> index in its rank's manifest
                for k in _pieces(tuple(chunk["sizes"]), local_lo, local_hi, element, piece_bytes):
                    name = chunk["pieces"][k]
                    if name not in index:
                        raise _core.CorruptDataError(f"{where}: rank {rank}'s manifest lacks "
                                                     f"piece {name} of sharded tensor {pointer}")
                    pieces[k] = index[name]
                rank_reads = reads.setdefault(rank, [])
                target_lo = [a - o for a, o in zip(lo, offsets)]
                target_hi = [b - o for b, o in zip(hi, offsets)]
                source_run = _run(tuple(chunk["sizes"]), local_lo, local_hi)
                target_run = _run(tuple(sizes), target_lo, target_hi)
                if (source_run is not None and target_run is not None and target.dtype == dtype
                        and target.device.type == "cpu" and target.is_contiguous()):
                    in_place, partial = _read_in_place(
                        target, target_run[0] * element, source_run[0] * element,
                        (source_run[0] + source_run[1]) * element, chunk["nbytes"], piece_bytes,
                        pieces, keep)
                    rank_reads += in_place
                    copies += partial
                    continue
                # Only the pieces read are ever touched: the rest of the buffer stays unmapped.
                buffer = torch.empty(chunk["nbytes"], dtype=torch.uint8)
                keep.append(buffer)
                rank_reads += [(i, buffer.data_ptr() + k * piece_bytes) for k, i in pieces.items()]
                source = buffer.view(dtype).view(chunk["sizes"])
                copies.append((target, [slice(a, b) for a, b in zip(target_lo, target_hi)],
                               source, [slice(a, b) for a, b in zip(local_lo, local_hi)]))
        self._read_ranks(reads, where)
        with torch.no_grad():
            for target, target_box, source, source_box in copies:
                target[tuple(target_box)].copy_(source[tuple(source_box)])

    def _read_ranks(self, reads: Dict[int, List[Tuple[int, int]]], where: str) -> None:
        """Runs each rank's reads, up to _RANKS_READ_AT_ONCE ranks' at once (each call releases
        the GIL and reads with its own threads); the first failure in rank order is raised once
        all are done."""
        def read_rank(rank: int) -> Optional[BaseException]:
            try:
                self._readers[rank].read(reads[rank], **self._options)
            except _core.CorruptDataError as error:
                wrapped = _core.CorruptDataError(f"{where}: a piece of a sharded tensor saved "
                                                 f"by rank {rank}: {error}")
                wrapped.__cause__ = error
                return wrapped
            except Exception as error:  # re-raised on the calling thread
                return error
            return None

        ranks = sorted(rank for rank, rank_reads in reads.items() if rank_reads)
        if len(ranks) <= 1:
            errors = [read_rank(rank) for rank in ranks]
        else:
            with ThreadPoolExecutor(min(len(ranks), _RANKS_READ_AT_ONCE),
                                    thread_name_prefix="zerowait-shard-read") as pool:
                errors = list(pool.map(read_rank, ranks))
        for error in errors:
            if error is not None:
                raise error

    def _piece_index(self, rank: int, where: str) -> Dict[str, int]:
        if not 0 <= rank < self._world_size:
            raise _core.CorruptDataError(f"{where}: a sharded chunk names rank {rank}, but the "
                                         f"step has {self._world_size} ranks")
        manifest = self._manifest(rank)
        if "_piece_index" not in manifest:
            manifest["_piece_index"] = {t["name"]: i for i, t in enumerate(manifest["tensors"])}
        return manifest["_piece_index"]
