"""What a step written through ``zerowait.dcp`` records for torch.distributed.checkpoint, and
how DCP's ``Metadata`` is rebuilt from it.

The coordinator (rank 0) records the global part in its rank manifest's structure: every tensor
as a ``sharded`` entry (dtype, global shape, each chunk's offsets, sizes, writer rank and piece
names: the format of ``_checkpoint_sharded``, so ``ShardedLoad`` reads it and
``Checkpointer.load()`` returns whole tensors), plus a ``dcp`` section: each tensor's
``TensorProperties``, the order of the state dict's keys, which rank wrote each bytes item, and
the plans' ``planner_data`` merged as DefaultSavePlanner merges them. Each rank records the
bytes items it wrote (their size is known only once the planner has serialized them) in the
``dcp`` section of its own part.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import ChainMap
from typing import Any, Dict, List, Optional, Tuple

from zerowait import _core
from zerowait._checkpoint_device import DeviceCopies
from zerowait._checkpoint_state import (
    _STRUCTURE_FORMAT,
    _STRUCTURE_VERSION,
    _json_pointer,
    _Restore,
    _Snapshot,
)

DCP_SECTION_VERSION = 1
_STEP_NAME = re.compile(r"^step-(\d+)$")


def parse_checkpoint_id(checkpoint_id: Any) -> Tuple[Optional[str], Optional[int]]:
    """(directory, step) named by a DCP ``checkpoint_id``: an int is a step of the directory the
    Writer or Reader was made with (directory None); ``DIR/step-N`` (a path or an s3:// URL) is
    step N of DIR; any other path is a directory whose step is chosen as without one."""
    if isinstance(checkpoint_id, bool):
        raise TypeError(f"checkpoint_id must be a path, a URL or a step number, not "
                        f"{checkpoint_id!r}")
    if isinstance(checkpoint_id, int):
        if checkpoint_id < 0:
            raise ValueError(f"a step number is non-negative, not {checkpoint_id}")
        return None, checkpoint_id
    text = os.fspath(checkpoint_id)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    trimmed = text.rstrip("/")
    head, _, tail = trimmed.rpartition("/")
    match = _STEP_NAME.match(tail)
    if match and head and not head.endswith(":/"):  # "s3://step-3" is a bucket, not a step
        return head, int(match.group(1))
    return text, None


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def piece_names(pointer: str, offsets: Any, nbytes: int, piece_bytes: int) -> List[str]:
    """The names a chunk's pieces are stored under: the tensor's key and the chunk's offsets,
    so that an error about a piece names both (``/model.w~chunk[6,0]~piece0``)."""
    chunk = ",".join(str(int(o)) for o in offsets)
    return [f"{pointer}~chunk[{chunk}]~piece{k}" for k in range(-(-nbytes // piece_bytes))]


def encode_value(value: Any, what: str, allow_pickle: bool) -> Any:
    """A plain value (planner_data) as a structure node, by the Checkpointer's own encoding."""
    snapshot = _Snapshot(allow_pickle)
    document = json.loads(snapshot.encode_state(value))
    if snapshot.tensors:
        raise TypeError(f"{what} holds tensors; zerowait.dcp records it as plain values only")
    return document["root"]


def decode_value(node: Any, what: str, allow_pickle: bool) -> Any:
    manifest = {"tensors": [], "structure": {"format": _STRUCTURE_FORMAT,
                                             "version": _STRUCTURE_VERSION, "root": node}}
    restore = _Restore(manifest, what, allow_pickle, "cpu", DeviceCopies())
    return restore.finish(restore.decode_state(None))


def _properties(properties: Any) -> Dict[str, Any]:
    return {"dtype": dtype_name(properties.dtype),
            "layout": str(properties.layout).removeprefix("torch."),
            "requires_grad": bool(properties.requires_grad),
            "memory_format": str(properties.memory_format).removeprefix("torch."),
            "pin_memory": bool(properties.pin_memory)}


def global_record(plans: List[Any], piece_bytes: int, allow_pickle: bool) -> Dict[str, Any]:
    """The coordinator's record of a save, from the global plan (rank i's plan at index i, items
    in the order DCP's Metadata lists them): the structure document of its part, less the bytes
    items it writes itself (added by part_document)."""
    import torch
    from torch.distributed.checkpoint.planner import WriteItemType

    sharded: Dict[str, Dict[str, Any]] = {}
    properties: Dict[str, Dict[str, Any]] = {}
    order: List[str] = []
    bytes_writers: Dict[str, int] = {}
    root = []
    for rank, plan in enumerate(plans):
        for item in plan.items:
            fqn = item.index.fqn
            pointer = _json_pointer((fqn,))
            if item.type == WriteItemType.BYTE_IO:
                order.append(fqn)
                bytes_writers[fqn] = rank
                continue
            data = item.tensor_data
            if pointer not in sharded:
                order.append(fqn)
                element = torch.empty((), dtype=data.properties.dtype).element_size()
                sharded[pointer] = {"dtype": dtype_name(data.properties.dtype),
                                    "shape": list(data.size), "element_size": element,
                                    "chunks": []}
                properties[fqn] = _properties(data.properties)
                root.append([fqn, {"type": "sharded", "key": pointer,
                                   "dtype": dtype_name(data.properties.dtype),
                                   "shape": list(data.size), "device": "cpu"}])
            entry = sharded[pointer]
            offsets, sizes = list(data.chunk.offsets), list(data.chunk.sizes)
            nbytes = math.prod(sizes) * entry["element_size"]
            entry["chunks"].append({"offsets": offsets, "sizes": sizes, "rank": rank,
                                    "nbytes": nbytes, "piece_bytes": piece_bytes,
                                    "pieces": piece_names(pointer, offsets, nbytes, piece_bytes)})
    planner_data = encode_value(merged_planner_data([p.planner_data for p in plans]),
                                "the plans' planner_data", allow_pickle)
    return {"format": _STRUCTURE_FORMAT, "version": _STRUCTURE_VERSION,
            "root": {"type": "dict", "items": root},
            "sharded": {"version": 1, "tensors": sharded},
            "dcp": {"version": DCP_SECTION_VERSION, "coordinator": True, "order": order,
                    "properties": properties, "bytes_writers": bytes_writers,
                    "planner_data": planner_data}}


def part_document(record: Optional[Dict[str, Any]], bytes_items: Dict[str, Any],
                  extra: Dict[str, Any]) -> str:
    """The structure JSON of one rank's part: the coordinator's record (None on other ranks) with
    the bytes items this rank wrote ({fqn: {"nbytes", "name"}}) and ``extra`` (save id, ...)."""
    document = dict(record) if record is not None else {
        "format": _STRUCTURE_FORMAT, "version": _STRUCTURE_VERSION,
        "root": {"type": "dict", "items": []},
        "dcp": {"version": DCP_SECTION_VERSION, "coordinator": False}}
    document["dcp"] = dict(document["dcp"], bytes=bytes_items, **extra)
    return json.dumps(document, allow_nan=False, separators=(",", ":"))


def dcp_section(structure: Any, where: str) -> Dict[str, Any]:
    section = structure.get("dcp") if isinstance(structure, dict) else None
    if not isinstance(section, dict):
        raise _core.CorruptDataError(f"{where} was not written through zerowait.dcp (its rank "
                                     f"manifest has no dcp section); load it with "
                                     f"zerowait.Checkpointer")
    if section.get("version") != DCP_SECTION_VERSION:
        raise _core.UnsupportedError(f"{where}: dcp section version {section.get('version')} "
                                     f"is not {DCP_SECTION_VERSION}; upgrade zerowait")
    return section


def merged_planner_data(per_rank: List[Any]) -> Any:
    """Metadata.planner_data as DefaultSavePlanner merges the plans' (the first rank's entry wins);
    None when no plan has any."""
    if all(p is None for p in per_rank):
        return None
    if all(p is None or isinstance(p, dict) for p in per_rank):
        return dict(ChainMap(*[p for p in per_rank if p is not None]))
    raise _core.UnsupportedError("the plans' planner_data are not dicts: zerowait.dcp merges "
                                 "planner_data as DefaultSavePlanner does")


def build_metadata(structure: Dict[str, Any], where: str, allow_pickle: bool) -> Any:
    """DCP's Metadata of a step from its coordinator's structure document."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    section = dcp_section(structure, where)
    try:
        sharded = structure["sharded"]["tensors"]
        state_dict_metadata: Dict[str, Any] = {}
        storage_data: Dict[Any, Any] = {}
        for fqn in section["order"]:
            if fqn in section["bytes_writers"]:
                state_dict_metadata[fqn] = BytesStorageMetadata()
                storage_data[MetadataIndex(fqn)] = section["bytes_writers"][fqn]
                continue
            entry = sharded[_json_pointer((fqn,))]
            p = section["properties"][fqn]
            properties = TensorProperties(
                dtype=getattr(torch, p["dtype"]), layout=getattr(torch, p["layout"]),
                requires_grad=p["requires_grad"],
                memory_format=getattr(torch, p["memory_format"]), pin_memory=p["pin_memory"])
            chunks = [ChunkStorageMetadata(offsets=torch.Size(c["offsets"]),
                                           sizes=torch.Size(c["sizes"]))
                      for c in entry["chunks"]]
            state_dict_metadata[fqn] = TensorStorageMetadata(
                properties=properties, size=torch.Size(entry["shape"]), chunks=chunks)
            for j, c in enumerate(entry["chunks"]):
                storage_data[MetadataIndex(fqn, c["offsets"], j)] = c["rank"]
        planner_data = decode_value(section["planner_data"], f"{where}: planner_data",
                                    allow_pickle)
        storage_meta = StorageMeta(checkpoint_id=section.get("checkpoint_id"),
                                   save_id=section.get("save_id"))
    except (KeyError, TypeError, AttributeError) as error:
        raise _core.CorruptDataError(f"{where}: malformed dcp section in the coordinator's rank "
                                     f"manifest ({type(error).__name__}: {error})") from error
    return Metadata(state_dict_metadata=state_dict_metadata, planner_data=planner_data,
                    storage_data=storage_data, storage_meta=storage_meta,
                    version=section.get("dcp_version"))


def metadata_differences(recorded: Any, given: Any) -> List[str]:
    """How the Metadata rebuilt from a step's record differs from the planner's (empty: none)."""
    problems = []
    mine, theirs = recorded.state_dict_metadata, given.state_dict_metadata
    for fqn in sorted(set(mine) | set(theirs)):
        if mine.get(fqn) != theirs.get(fqn):
            problems.append(f"{fqn}: recorded {mine.get(fqn)}, planner {theirs.get(fqn)}")
    if recorded.planner_data != given.planner_data:
        problems.append("planner_data differs")
    return problems
