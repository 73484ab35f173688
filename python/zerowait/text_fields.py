"""Fields decoded as ``"text"`` (str) or ``"json"`` (any JSON value): Python objects, so they
are made here, with the GIL, from the raw bytes the C++ loader delivers. A sample whose bytes
are not UTF-8 (or not JSON) is a corrupt sample and follows ``on_corrupt``."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

TEXT_KINDS = ("text", "json")


def parse_value(kind: str, data: Any) -> Any:
    """One field's bytes (bytes or a uint8 array) as str ("text") or a JSON value ("json")."""
    text = bytes(data).decode("utf-8")
    return json.loads(text) if kind == "json" else text


def parse_columns(arrays: Dict[str, Any], kinds: Dict[str, str]
                  ) -> Tuple[Dict[str, Any], List[Tuple[int, str]]]:
    """Replaces each text/json field's raw column and its offsets by a list; returns the batch
    without the samples that failed, and (global index, reason) for each of those."""
    failed: Dict[int, str] = {}
    parsed: Dict[str, List[Any]] = {}
    for name, kind in kinds.items():
        if name not in arrays:
            continue
        data, offsets = arrays[name], arrays[name + ".offsets"]
        values = []
        for row in range(len(offsets) - 1):
            try:
                values.append(parse_value(kind, data[offsets[row]:offsets[row + 1]]))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                failed.setdefault(row, f"field '{name}' is not {kind_name(kind)}: {e}")
                values.append(None)
        parsed[name] = values
    for name in parsed:
        del arrays[name + ".offsets"]
        arrays[name] = parsed[name]
    if not failed:
        return arrays, []
    index = arrays["__index__"]
    return drop_rows(arrays, sorted(failed)), [(int(index[r]), failed[r]) for r in sorted(failed)]


def kind_name(kind: str) -> str:
    return "UTF-8 text" if kind == "text" else "JSON"


def drop_rows(arrays: Dict[str, Any], rows: List[int]) -> Dict[str, Any]:
    """The batch without ``rows``: per-row arrays and lists filtered, raw fields rebuilt."""
    n = len(arrays["__index__"])
    keep = np.ones(n, dtype=bool)
    keep[rows] = False
    out: Dict[str, Any] = {}
    for name, value in arrays.items():
        if name.endswith(".offsets") and name[:-len(".offsets")] in arrays:
            continue
        if name + ".offsets" in arrays:  # a raw field: concatenate the kept rows' bytes
            offsets = arrays[name + ".offsets"]
            pieces = [value[offsets[i]:offsets[i + 1]] for i in range(n) if keep[i]]
            out[name] = np.concatenate(pieces) if pieces else value[:0].copy()
            sizes = np.array([len(p) for p in pieces], dtype=np.int64)
            out[name + ".offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        elif isinstance(value, list):
            out[name] = [v for v, k in zip(value, keep) if k]
        else:
            out[name] = value[keep]
    return out


def text_kinds(decode: Optional[Dict[str, Any]]) -> Dict[str, str]:
    """{field: "text" | "json"} from a Loader's ``decode`` argument."""
    return {name: spec for name, spec in (decode or {}).items()
            if isinstance(spec, str) and spec in TEXT_KINDS}

