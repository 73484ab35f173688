"""How ``zerowait.Checkpointer`` turns a state into tensors plus a JSON structure, and back.

A state is a nested structure of dicts (any keys), lists and tuples holding torch tensors, numpy
arrays and plain values. ``_Snapshot`` walks it into the list of tensors the C++ engine saves
(named by the JSON pointer of their key path) and a JSON description of everything else (the
walk itself is C++, python/state_walk.cpp, which hands the values it does not take to
``_Snapshot._encode``);
``_Restore`` reads a rank manifest back into the same structure, allocating tensors (or using
those of ``into=``) and queuing the reads that fill them.
"""

from __future__ import annotations

import base64
import collections
import collections.abc
import json
import math
import os
import pickle
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from zerowait import _checkpoint_device as _device
from zerowait import _checkpoint_sharded as _sharded
from zerowait import _core

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
# --- state -> tensors + structure JSON ---------------------------------------------------------

# The host-addressable test of tensors (a seam the tests replace to run the GPU paths with CPU
# tensors): while it is this one, the C++ walk reads contiguous CPU tensors in place itself.
_HOST_ADDRESSABLE = _device._host_addressable


def _int_node(value: int) -> Any:
    """An int as itself, or, beyond 64 bits (which the manifest's JSON parser turns into a
    double), as its decimal digits."""
    return value if -(1 << 63) <= value < (1 << 64) else {"type": "int", "value": str(value)}


def _path_text(path: Tuple[Any, ...]) -> str:
    """state["optimizer"]["param_groups"][0]: how a key path reads in errors."""
    return "state" + "".join(f"[{json.dumps(k) if isinstance(k, str) else k}]" for k in path)


def _escape(key: Any) -> str:
    """A key as one token of an RFC 6901 JSON pointer ("/model/layer.0.weight")."""
    text = key if type(key) is str else str(key)
    if "~" in text or "/" in text:
        return text.replace("~", "~0").replace("/", "~1")
    return text


def _json_pointer(path: Tuple[Any, ...]) -> str:
    """The RFC 6901 pointer of a key path: "/model/layer.0.weight" (the walk builds the same
    pointers incrementally; zerowait.dcp names single keys with it)."""
    return "".join("/" + _escape(k) for k in path)


# torch dtype -> (name, safetensors name or None, bytes per grouped element, floating point,
# complex):
# what _Snapshot._tensor needs of a dtype, worked out once per dtype (saves of thousands of
# tensors spend their time in this walk).
_DTYPE_FACTS: Dict[Any, Tuple[str, Any, int, bool, bool]] = {}


def _dtype_facts(dtype: Any) -> Tuple[str, Any, int, bool, bool]:
    facts = _DTYPE_FACTS.get(dtype)
    if facts is None:
        name = str(dtype).removeprefix("torch.")
        size = dtype.itemsize
        # Byte grouping works on the floating-point numbers a complex number is made of.
        facts = (name, _TORCH_TO_SAFETENSORS.get(name), size // (2 if dtype.is_complex else 1),
                 dtype.is_floating_point or dtype.is_complex, dtype.is_complex)
        _DTYPE_FACTS[dtype] = facts
    return facts


class _Snapshot:
    """Walks a state once: collects its tensors (what C++ stages) and describes the rest.

    Structure nodes are JSON: null, bools, 64-bit ints, finite floats and strings as themselves,
    the rest as objects tagged by "type": dict / odict (items as [key, value] pairs, so int keys
    stay ints), list, tuple, size (torch.Size), int (beyond 64 bits), float (non-finite),
    bytes / bytearray / pickle (base64), tensor and ndarray (index into the tensor list, dtype,
    shape; tensors also the device they came from, and whether they were Parameters).

    With ``owned`` set (a ``_checkpoint_copy.OwnedMemory``: the memory of the optimizers'
    parameters and state), host tensors read in place whose bytes an optimizer owns are
    ``tracked`` — (index, tensor, its ``_version`` now), copied in the background — and every
    other host tensor's index is in ``copy_now``.
    """

    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle
        self.tensors: List[tuple] = []  # what _Checkpointer.begin_save takes
        self._names: set = set()
        self._keep: List[Any] = []  # the arrays whose addresses are in self.tensors
        # (index, tensor, nbytes) whose staging the caller fills: CUDA tensors
        self.device_tensors: List[Tuple[int, Any, int]] = []
        self.sharded: Any = None  # a _checkpoint_sharded.ShardedSave: DTensors are saved
        self.owned: Any = None
        self.tracked: List[Tuple[int, Any, int]] = []
        self.owners: set = set()  # id() of the optimizers owning tracked tensors
        self.copy_now: List[int] = []
        self._torch = sys.modules.get("torch")
        self._tensor_types = ((self._torch.Tensor, self._torch.nn.Parameter)
                              if self._torch is not None else ())

    def encode_state(self, state: Any) -> str:
        # The walk is C++ (python/state_walk.cpp): it writes the containers, plain values and
        # contiguous CPU tensors itself and hands every other value to _encode below.
        torch = self._torch
        context = (torch.Tensor if torch else None, torch.nn.Parameter if torch else None,
                   torch.strided if torch else None, _DTYPE_FACTS, collections.OrderedDict,
                   _device._host_addressable is _HOST_ADDRESSABLE)
        root = _core._encode_state(self, state, context)
        text = (f'{{"format":"{_STRUCTURE_FORMAT}","version":{_STRUCTURE_VERSION},'
                f'"root":{root}}}')
        if self.sharded is not None and self.sharded.used:
            # Spliced in as JSON: its entries are made once per tensor, not at every save.
            text = f'{text[:-1]},"sharded":{self.sharded.section_json()}}}'
        return text

    def _encode(self, obj: Any, path: Tuple[Any, ...], pointer: str) -> Any:
        """The node of a value the C++ walk does not write itself (never a dict, OrderedDict,
        list or tuple: the C++ walk takes those, and every tensor it can read in place)."""
        kind = type(obj)
        if kind in self._tensor_types:
            return self._tensor(self._torch, obj, kind, path, pointer)
        if obj is None or kind in (bool, str):
            return obj
        if kind is int:
            return _int_node(obj)
        if kind is float:
            return obj if math.isfinite(obj) else {"type": "float", "value": repr(obj)}
        if kind in (bytes, bytearray):
            return {"type": kind.__name__, "data": base64.b64encode(obj).decode()}
        if kind is np.ndarray or isinstance(obj, np.generic):
            return self._ndarray(obj, path, pointer)
        if self.sharded is not None and _sharded.is_sharded(obj):
            return self.sharded.encode(self, obj, pointer or "/", lambda: _path_text(path))
        if self._torch is not None and kind is self._torch.Size:
            return {"type": "size", "items": list(obj)}
        return self._other(obj, path, "")

    def _refuse_key(self, path: Tuple[Any, ...], key: Any) -> None:
        raise TypeError(f"{_path_text(path)}: cannot save a key of type "
                        f"'{type(key).__name__}' ({key!r}); keys must be str or int")

    def _refuse_cycle(self, path: Tuple[Any, ...]) -> None:
        raise TypeError(f"{_path_text(path)}: the state contains itself")

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

    def _add(self, pointer: str, dtype: str, shape: List[int], element_size: int,
             floating: bool, address: int, nbytes: int, keep: Any, source: Any = None) -> int:
        """Adds a tensor of the save; ``source``: the tensor whose memory (the caller's) the
        save reads at ``address``, for the background copy's guards (None: copied now)."""
        name = pointer or "/"  # the engine wants a name; "" the root
        if name in self._names:  # int key 0 and str key "0" of one dict share a pointer
            name += f"#{len(self.tensors)}"
        self._names.add(name)
        self._keep.append(keep)
        index = len(self.tensors)
        self.tensors.append((name, dtype, shape, element_size, floating, address, nbytes))
        if self.owned is not None and address:
            # Inference tensors keep no version count: nothing could tell a torn copy.
            owner = (self.owned.owner(address, nbytes)
                     if source is not None and not source.is_inference() else None)
            if owner is None:
                self.copy_now.append(index)
            else:
                self.tracked.append((index, source, source._version))
                self.owners.add(owner)
        return index

    def add_pieces(self, names: List[str], element_size: int, floating: bool, tensor: Any,
                   piece_bytes: int, holder: Any = None) -> None:
        """Adds the bytes of host tensor ``tensor`` (contiguous) as pieces of ``piece_bytes``
        named ``names``: no view per piece, one ownership lookup and one guard for all of them
        (pieces of one tensor share its memory's owner and its version count; a change is
        reported by the first piece's name). ``holder``: a DTensor whose local shard ``tensor``
        is, guarded too (an in-place operation on a DTensor counts in its own version, not in
        its shard's)."""
        if not names:
            return
        address, nbytes = tensor.data_ptr(), tensor.nbytes
        if not self._names.isdisjoint(names):  # int key 0 and str key "0" (see _add)
            names = [name + f"#{len(self.tensors) + k}" if name in self._names else name
                     for k, name in enumerate(names)]
        self._names.update(names)
        first = len(self.tensors)
        last = len(names) - 1
        self.tensors.extend([(name, "U8", [piece_bytes], element_size, floating,
                              address + k * piece_bytes, piece_bytes)
                             for k, name in enumerate(names[:last])])
        tail = nbytes - last * piece_bytes
        self.tensors.append((names[last], "U8", [tail], element_size, floating,
                             address + last * piece_bytes, tail))
        self._keep.append(tensor)
        if self.owned is None or not address:
            return
        owner = None if tensor.is_inference() else self.owned.owner(address, nbytes)
        if owner is None:
            self.copy_now.extend(range(first, first + len(names)))
            return
        self.owners.add(owner)
        self.tracked.append((first, tensor, tensor._version))
        if holder is not None:
            self.tracked.append((first, holder, holder._version))

    def _tensor(self, torch: Any, tensor: Any, kind: Any, path: Tuple[Any, ...],
                pointer: str) -> Any:
        # Read in place: no detach() (a new tensor object, the walk's costliest call) unless
        # the elements are copied; the bytes, shape and version counter are the same.
        t = tensor
        if t.layout is not torch.strided or t.is_quantized or t.is_meta:
            layout = "quantized" if t.is_quantized else str(t.layout).removeprefix("torch.")
            return self._other(tensor, path, f"a {layout} tensor on {t.device}")
        dtype, stored, element, floating, complex_ = (_DTYPE_FACTS.get(t.dtype)
                                                      or _dtype_facts(t.dtype))
        shared = t.is_contiguous()  # else a copy of the elements, private to this save
        if t.is_neg() or (complex_ and t.is_conj()):  # only complex tensors have a conj bit
            t = _detached(t).resolve_conj().resolve_neg()
            shared = t.is_contiguous()
        if not shared:
            t = _contiguous(torch, _detached(t))
        nbytes = t.nbytes
        shape = list(t.shape)
        on_host = _device._host_addressable(t)
        index = self._add(pointer, stored or "U8", shape if stored else [nbytes], element,
                          floating, t.data_ptr() if on_host else 0, nbytes, t,
                          t if shared else None)
        if not on_host:
            self.device_tensors.append((index, t, nbytes))
        node = {"type": "tensor", "index": index, "dtype": dtype, "shape": shape,
                "device": "cpu" if t.is_cpu else str(tensor.device)}
        if kind is not torch.Tensor:  # a Parameter
            node["parameter"] = True
            node["requires_grad"] = tensor.requires_grad
        return node

    def _ndarray(self, value: Any, path: Tuple[Any, ...], pointer: str) -> Any:
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
        index = self._add(pointer, name or "U8", list(data.shape) if name else [data.nbytes],
                          element, floating, data.ctypes.data, data.nbytes, data)
        node = {"type": "ndarray", "index": index, "dtype": array.dtype.str,
                "shape": list(array.shape)}
        if isinstance(value, np.generic):
            node["scalar"] = True
        return node


def _detached(t: Any) -> Any:
    """t without autograd history, so that copying its elements records no graph."""
    return t.detach() if t.requires_grad else t


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
    tensor, and lists the reads that fill them straight from the files. A tensor bound for a
    CUDA device is allocated there and filled through pinned staging (``device``'s streams).
    With ``mapped_root`` (the step copy's directory on this machine), a new CPU tensor stored
    uncompressed is instead a view of a private mapping of its file, only verified."""

    def __init__(self, manifest: Dict[str, Any], what: str, allow_pickle: bool,
                 map_location: Any, device: _device.DeviceCopies,
                 mapped_root: Optional[str] = None) -> None:
        self._tensors = manifest["tensors"]
        self._mapped_root = mapped_root
        self._mapped_files: Dict[str, Any] = {}  # file -> (size, its mapping), None: unmapped
        self._what = what
        self._allow_pickle = allow_pickle
        self._map_location = map_location
        self._device = device
        self._cuda_devices: set = set()  # of the reads into CUDA memory
        try:
            structure = manifest["structure"]
            valid = structure.get("format") == _STRUCTURE_FORMAT
        except (KeyError, AttributeError):
            valid = False
        if not valid:
            raise _core.CorruptDataError(f"{what}: its manifest holds no zerowait state")
        if structure.get("version") != _STRUCTURE_VERSION:
            raise _core.UnsupportedError(f"{what}: state structure version "
                                         f"{structure.get('version')} is not {_STRUCTURE_VERSION}")
        self._root = structure["root"]
        # (manifest index, destination address, fresh, device, cudaStream_t, mapped):
        # restore.hpp's TensorRead
        self.reads: List[Tuple[int, int, bool, int, int, bool]] = []
        self._keep: List[Any] = []  # the destinations of self.reads
        self._copies: List[Tuple[Any, Any]] = []  # (target, read buffer) once the reads are done
        # (placeholder, build(placeholder)): values made from read bytes.
        self._after: List[Tuple[Any, Callable[[Any, Any], Any]]] = []
        self.sharded: Any = None  # a _checkpoint_sharded.ShardedLoad for "sharded" nodes

    def decode_state(self, into: Any) -> Any:
        """The state with every value that needs no bytes from the files; fills self.reads."""
        try:
            state = self._decode(self._root, (), into)
        except (KeyError, IndexError, TypeError, AttributeError) as error:
            raise _core.CorruptDataError(f"{self._what}: malformed state structure in the "
                                         f"manifest ({type(error).__name__}: {error})") from error
        # The copies into CUDA memory wait for what the caller queued before: writes to into=
        # tensors, and kernels still using memory the new tensors were given.
        self._device.order_after_callers(self._cuda_devices)
        return state

    def finish(self, state: Any) -> Any:
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
            value = build(placeholder)
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
        if kind == "sharded" and self.sharded is not None:
            dtype, target = self._into_tensor(node, path, into, "a sharded tensor")
            return self.sharded.decode(node, dtype, target, self._map_location)
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

    def _into_tensor(self, node: Dict[str, Any], path: Tuple[Any, ...], into: Any,
                     what: str) -> Tuple[Any, Any]:
        """(torch dtype of a tensor node, ``into`` once checked to be a tensor of its dtype and
        shape, or None)."""
        import torch

        dtype = getattr(torch, node["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise _core.UnsupportedError(f"{self._what}: {_path_text(path)} has dtype "
                                         f"{node['dtype']}, which this torch does not have")
        if into is None:
            return dtype, None
        if not isinstance(into, torch.Tensor):
            raise ValueError(f"{_path_text(path)}: the checkpoint holds {what}, but into= "
                             f"holds {type(into).__name__}")
        if into.dtype != dtype or tuple(into.shape) != tuple(node["shape"]):
            raise ValueError(f"{_path_text(path)}: the checkpoint holds {node['dtype']} "
                             f"{node['shape']}, but into= holds "
                             f"{str(into.dtype).removeprefix('torch.')} {list(into.shape)}")
        return dtype, into

    def _tensor(self, node: Dict[str, Any], path: Tuple[Any, ...], into: Any) -> Any:
        import torch

        dtype, target = self._into_tensor(node, path, into, "a tensor")
        shape = tuple(node["shape"])
        # CUDA destinations are allocated on their device and filled through staging.
        location = node["device"] if self._map_location is None else self._map_location
        device = target.device if target is not None else torch.device(location)
        on_device = device.type == "cuda"
        if target is None and not on_device and self._mapped_root is not None:
            mapped = self._mapped(node, path, dtype, shape)
            if mapped is not None:
                self._after.append((mapped, _as_saved(torch, node)))
                return mapped
        # A whole tensor restored into a DTensor or ShardedTensor: read whole, copy each local part.
        parts = _sharded.target_boxes(target) if _sharded.is_sharded(target) else None
        direct = (target is not None and parts is None and target.device.type in ("cpu", "cuda")
                  and target.is_contiguous() and not target.is_conj() and not target.is_neg())
        buffer = target if direct else torch.empty(shape, dtype=dtype,
                                                   device=device if on_device else "cpu")
        index = self._stored(node, path, buffer.numel() * buffer.element_size())
        self._read(index, buffer, fresh=buffer is not target)
        if target is not None:
            if parts is not None:
                self._copies += [(local, buffer[tuple(slice(o, o + n) for o, n in zip(*box))])
                                 for local, *box in parts]
            elif not direct:
                self._copies.append((target, buffer))
            return target

        self._after.append((buffer, _as_saved(torch, node, device)))
        return buffer

    def _mapped(self, node: Dict[str, Any], path: Tuple[Any, ...], dtype: Any,
                shape: Tuple[int, ...]) -> Any:
        """A CPU tensor viewing its stored bytes in a private (copy-on-write) mapping of its
        file, its read queued as a verification; None where that cannot be (compressed, empty,
        unaligned for its dtype, or the file cannot be mapped): the tensor is then read."""
        import torch

        itemsize = dtype.itemsize
        nbytes = math.prod(shape) * itemsize
        index = self._stored(node, path, nbytes)
        stored = self._tensors[index]
        file, offset = stored["file"], stored["offset"]
        if (stored["codec"] != "none" or nbytes == 0 or offset % itemsize
                or file.startswith("/") or ".." in file.split("/")):
            return None
        if file not in self._mapped_files:
            try:
                full = os.path.join(self._mapped_root, file)
                size = os.stat(full).st_size  # an empty file holds no tensor to map
                self._mapped_files[file] = (size, torch.UntypedStorage.from_file(
                    full, shared=False, nbytes=size)) if size else None
            except (OSError, RuntimeError):
                self._mapped_files[file] = None  # the read names what is wrong with it
        mapping = self._mapped_files[file]
        if mapping is None or offset + nbytes > mapping[0]:
            return None
        tensor = torch.empty(0, dtype=dtype).set_(mapping[1], offset // itemsize, shape)
        self._queue(index, tensor.data_ptr(), tensor, False, _device.HOST_MEMORY, 0, mapped=True)
        return tensor

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
            self._read_array(self._stored(node, path, buffer.nbytes), buffer, fresh=not direct)
            if not direct:
                self._copies.append((into, buffer))
            return into
        array = np.empty(shape, stored)
        self._read_array(self._stored(node, path, array.nbytes), array, fresh=True)
        if stored != dtype or node.get("scalar"):
            def build(read: Any) -> Any:
                value = read.astype(dtype) if stored != dtype else read
                return value[()] if node.get("scalar") else value

            self._after.append((array, build))
        return array

    def _read(self, index: int, tensor: Any, fresh: bool) -> None:
        """Queues a read of tensor ``index`` into ``tensor``'s memory; ``fresh``: memory
        allocated for this load and not yet touched (the reader asks for huge pages there)."""
        device, stream = self._device.read_target(tensor)
        if device >= 0:
            self._cuda_devices.add(device)
        self._queue(index, tensor.data_ptr(), tensor, fresh, device, stream)

    def _read_array(self, index: int, array: Any, fresh: bool) -> None:
        self._queue(index, array.ctypes.data, array, fresh, _device.HOST_MEMORY, 0)

    def _queue(self, index: int, address: int, keep: Any, fresh: bool, device: int,
               stream: int, mapped: bool = False) -> None:
        if self._tensors[index]["nbytes"]:  # an empty tensor has nothing to read (and may be
            self.reads.append((index, address, fresh, device, stream, mapped))  # at address 0)
            self._keep.append(keep)


def _as_saved(torch: Any, node: Dict[str, Any], device: Any = None) -> Callable[[Any], Any]:
    """What makes a restored tensor what was saved: moved to ``device`` (if given and not
    already there) and a Parameter again if it was one."""
    def build(tensor: Any) -> Any:
        if device is not None and tensor.device != device:
            tensor = tensor.to(device)
        if node.get("parameter"):  # made here: a moved Parameter would be a plain tensor
            tensor = torch.nn.Parameter(tensor, requires_grad=node["requires_grad"])
        return tensor

    return build


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
