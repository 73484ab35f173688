"""Batch columns in and out of flat buffers, for ``zerowait.Loader(map=fn)`` (map_stage.py).

The parent lays a batch's columns into a shared-memory slot (_Layout) and a worker hands ``fn``
views of each sample; the worker collates ``fn``'s results (_collate) and stacks them into the
slot's output file (_OutputWriter), which the parent copies out (_read_output). Bytes only: no
sample goes through pickle.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from zerowait import _core


class MapError(_core.ZerowaitError, RuntimeError):
    """``fn`` raised on a sample, or returned something that cannot be collated. ``index``,
    ``shard``, ``key`` name the sample (None when the batch as a whole failed)."""

    def __init__(self, message: str, index: Optional[int] = None,
                 shard: Optional[str] = None, key: Optional[str] = None) -> None:
        super().__init__(message)
        self.index, self.shard, self.key = index, shard, key


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # numpy output without torch installed
        return None
    return torch


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
