"""Writing a dataset from Python objects: the rows of a table, a query, a generator.

:class:`ShardWriter` and :func:`write_dataset` produce what ``zerowait pack`` produces (shards,
manifest, per-sample checksums, quarantine.json) from dicts instead of files, streaming: memory
holds one sample. The C++ core writes; this module only turns Python values into field bytes.
"""

from __future__ import annotations

import io
import json
import numbers
import os
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Sequence

from zerowait import _core
from zerowait._paths import local_path

KEY = "__key__"  # the sample's key, as in WebDataset; otherwise the sample's number, 9 digits


def encode_field(name: str, value: Any) -> Optional[Any]:
    """The bytes stored for one field value (None: the field is left out of the sample).

    - bytes, bytearray, memoryview: as they are;
    - str: UTF-8;
    - bool: ``b"1"`` / ``b"0"``; other integers: ASCII decimal (``decode={"cls": "int"}`` reads
      them back); other real numbers: ``repr`` of the float;
    - NumPy arrays and torch tensors: the ``.npy`` format (dtype and shape in its header;
      ``numpy.load(io.BytesIO(b))`` reads it back);
    - PIL images: encoded in their own format (JPEG, PNG, WebP...), PNG when they have none;
    - dicts, lists and tuples: JSON text.

    Name fields as WebDataset does, by what they hold (``jpg``, ``cls``, ``txt``, ``json``,
    ``npy``): image fields are checked as ``pack`` checks image files.
    """
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, numbers.Integral):
        return str(int(value)).encode("ascii")
    if isinstance(value, numbers.Real):
        return repr(float(value)).encode("ascii")
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False).encode("utf-8")
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        value = value.detach().cpu().numpy()
        module = "numpy"
    if module == "numpy":
        import numpy as np

        out = io.BytesIO()
        np.lib.format.write_array(out, np.asarray(value), allow_pickle=False)
        return out.getbuffer()
    if module == "PIL" and hasattr(value, "save"):
        out = io.BytesIO()
        value.save(out, format=getattr(value, "format", None) or "PNG")
        return out.getbuffer()
    raise TypeError(f"field {name!r}: cannot store a {type(value).__qualname__}; give bytes, "
                    "str, a number, a NumPy array, a PIL image, or JSON-like dicts and lists")


class ShardWriter:
    """Writes samples (dicts of field name -> value) into a zerowait dataset at ``out``: a local
    directory or ``s3://BUCKET/PREFIX``, as ``zerowait.pack`` writes one.

    >>> with zerowait.ShardWriter("shards/") as writer:
    ...     for row in table:
    ...         writer.write({"__key__": row["id"], "jpg": row["image"], "cls": row["label"]})
    >>> writer.report["samples"]

    Values are stored as :func:`encode_field` says; a ``None`` value leaves that field out of the
    sample. ``__key__`` names the sample (keys must be unique); without it the sample's number,
    zero-padded to 9 digits, is its key. An image field that is not a whole image is quarantined
    as ``pack`` quarantines a bad file: ``write()`` returns False and the report lists it.

    The dataset exists only once the writer is closed: leaving the ``with`` block by an exception,
    or calling :meth:`abort`, publishes no manifest. An existing dataset at ``out`` is refused
    unless ``overwrite=True``. ``shard_size``, ``align``, ``verify_images``, ``sync`` and
    ``tmp_dir`` are ``pack``'s options; ``classes`` lists class names that a ``cls`` field
    indexes (``Dataset.classes``).
    """

    def __init__(
        self,
        out: Any,
        *,
        shard_size: int = 256 << 20,
        align: bool = False,
        verify_images: bool = False,
        overwrite: bool = False,
        sync: bool = True,
        classes: Sequence[str] = (),
        tmp_dir: Optional[Any] = None,
    ) -> None:
        self._writer = _core._DatasetWriter(
            os.fspath(out), shard_size=shard_size, align=align, verify_images=verify_images,
            overwrite=overwrite, sync=sync, classes=list(classes),
            tmp_dir=local_path(tmp_dir, "tmp_dir") if tmp_dir is not None else None)
        self._count = 0
        self.report: Optional[Dict[str, Any]] = None

    def write(self, sample: Mapping[str, Any]) -> bool:
        """Appends one sample; False when it was quarantined (a bad image field)."""
        key = sample.get(KEY)
        if key is None:
            key = f"{self._count:09d}"
        elif isinstance(key, bytes):
            key = os.fsdecode(key)
        elif not isinstance(key, str):
            key = str(key)
        self._count += 1
        fields = []
        for name, value in sample.items():
            if name == KEY:
                continue
            data = encode_field(name, value)
            if data is not None:
                fields.append((name, data))
        return self._writer.write(key, fields)

    def close(self) -> Dict[str, Any]:
        """Publishes the last shard, quarantine.json and the manifest; returns the report:
        samples, shards, bytes_in, bytes_out, seconds, quarantined ([{sample, reason}]) and
        manifest_path. Closing twice returns the same report."""
        if self.report is None:
            self.report = self._writer.finish()
        return self.report

    def abort(self) -> None:
        """Stops without publishing a manifest: no dataset appears at ``out``."""
        if not self._writer.closed:
            self._writer.abort()

    @property
    def samples(self) -> int:
        """Samples written so far."""
        return self.report["samples"] if self.report is not None else self._writer.samples

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_dataset(samples: Iterable[Mapping[str, Any]], out: Any, **options: Any) -> Dict[str, Any]:
    """Writes every sample of ``samples`` (an iterable of dicts: a list, a generator, a Hugging
    Face ``datasets`` table, ``pyarrow.Table.to_pylist()``) into a dataset at ``out`` and returns
    the report of :meth:`ShardWriter.close`. ``options`` are :class:`ShardWriter`'s. If iterating
    or writing raises, no dataset is published."""
    with ShardWriter(out, **options) as writer:
        for sample in samples:
            writer.write(sample)
    return writer.report


def token_windows(documents: Iterable[Any], seq_len: int, *, eos: Optional[int] = None,
                  dtype: str = "uint16", field: str = "tokens",
                  drop_last: bool = True) -> Iterator[Dict[str, bytes]]:
    """Packs token sequences for language-model pretraining: concatenates ``documents`` (each a
    sequence of token ids: a list, a NumPy array, a tensor), with ``eos`` after each when given,
    and cuts the stream into windows of exactly ``seq_len`` tokens. Yields one sample per window,
    ``{field: the window as little-endian dtype bytes}``, for :func:`write_dataset`; read them
    back with ``decode={field: zerowait.TokenWindow(seq_len, dtype=dtype)}`` (rows with no
    padding). A last, shorter window is dropped unless ``drop_last=False``. Memory holds one
    document and one window."""
    import numpy as np

    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, not {seq_len}")
    width = np.dtype(dtype).newbyteorder("<")
    if width.kind not in "iu" or width.itemsize not in (2, 4):
        raise ValueError(f"dtype must be uint16, uint32 or int32, not {dtype!r}")
    info = np.iinfo(width)
    pending = np.empty(0, dtype=width)
    for document in documents:
        tokens = np.asarray(document.detach().cpu() if hasattr(document, "detach") else document)
        if tokens.size and (tokens.min() < info.min or tokens.max() > info.max):
            raise ValueError(f"a document holds token ids outside {dtype} "
                             f"({int(tokens.min())}..{int(tokens.max())})")
        parts = [pending, tokens.astype(width, copy=False).ravel()]
        if eos is not None:
            parts.append(np.array([eos], dtype=width))
        pending = np.concatenate(parts)
        whole = len(pending) // seq_len * seq_len
        for start in range(0, whole, seq_len):
            yield {field: pending[start:start + seq_len].tobytes()}
        pending = pending[whole:]
    if len(pending) and not drop_last:
        yield {field: pending.tobytes()}
