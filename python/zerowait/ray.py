"""Packing a Ray Data dataset into one zerowait dataset, on every machine of a Ray cluster.

>>> import ray, zerowait.ray
>>> ds = ray.data.read_parquet("s3://bucket/raw/")      # rows: __key__, jpg, cls
>>> report = zerowait.ray.write_dataset(ds, "s3://bucket/train")
>>> report["samples"], report["tasks"]

Each write task of the Ray dataset writes the rows it is given as a dataset of its own, with
:class:`zerowait.ShardWriter`, below ``OUT/ray-RUN/task-NNNNNN``; once every task has finished,
the driver makes one merge (:func:`zerowait.merge` with ``whole_datasets=True``), which checks
every part's shards and keys and publishes ``OUT/manifest.json`` listing the parts' shards in
task order. No shard is copied; until the merge, nothing is published at ``OUT``.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Dict, Iterable, List, Optional, Sequence

try:
    import ray
    from ray.data import Datasink
except ImportError as error:  # zerowait itself does not need Ray; only this module does
    raise ImportError(
        "zerowait.ray needs Ray Data, which is not installed: pip install 'ray[data]'"
    ) from error

import zerowait
from zerowait.writer import KEY, ShardWriter

log = logging.getLogger(__name__)

RUN_PREFIX = "ray-"  # OUT/ray-RUN/task-NNNNNN: one run's parts, to find or delete them together


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python number it holds (what a single-process write is given), so
    that ``np.int64(3)`` is stored as ``b"3"`` and ``np.bool_(True)`` as ``b"1"``; anything else as
    it is (arrays stay arrays)."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", None) == 0 and \
            type(value).__module__ == "numpy":
        return item()
    return value


class ZerowaitDatasink(Datasink):
    """A Ray Data datasink that writes a zerowait dataset at ``out`` (a local directory every
    node shares, or ``s3://BUCKET/PREFIX``). Use :func:`write_dataset`, which checks ``out``
    first; the sink itself is for ``Dataset.write_datasink``. ``options`` are ShardWriter's
    ``shard_size``, ``align``, ``verify_images``, ``classes``, ``sync`` and ``tmp_dir`` (a
    local directory on every worker)."""

    def __init__(self, out: Any, *, overwrite: bool = False, **options: Any) -> None:
        self.out = os.fspath(out).rstrip("/")
        self.run = uuid.uuid4().hex[:12]
        self.overwrite = overwrite
        self.options = options
        self.report: Optional[Dict[str, Any]] = None

    @property
    def run_dir(self) -> str:
        """Where this write's parts go: OUT/ray-RUN."""
        return f"{self.out}/{RUN_PREFIX}{self.run}"

    def write(self, blocks: Iterable[Any], ctx: Any) -> Optional[Dict[str, Any]]:
        """Writes this task's rows as one dataset below :attr:`run_dir`; returns its report, or
        None when the task was given no row."""
        from ray.data.block import BlockAccessor

        part = f"{self.run_dir}/task-{ctx.task_idx:06d}"
        writer: Optional[ShardWriter] = None
        try:
            for block in blocks:
                for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
                    if row.get(KEY) is None:
                        raise ValueError(
                            f"a row written to {self.out} has no {KEY!r} column: each task of a "
                            "Ray write numbers only its own rows, so give every row a unique key "
                            f"(ds.map(lambda row: {{**row, {KEY!r}: ...}}))")
                    if writer is None:
                        # overwrite: a task that Ray runs again replaces its earlier attempt.
                        writer = ShardWriter(part, overwrite=True, **self.options)
                    writer.write({name: _plain(value) for name, value in row.items()})
            if writer is None:
                return None
            report = writer.close()
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        return {
            "task": ctx.task_idx,
            "dir": part,
            "samples": report["samples"],
            "shards": report["shards"],
            "bytes_out": report["bytes_out"],
            "seconds": report["seconds"],
            "quarantined": report["quarantined"],
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }

    def on_write_complete(self, write_result: Any) -> None:
        """Merges the tasks' datasets into OUT/manifest.json (the one merge), in task order."""
        tasks = sorted((r for r in write_result.write_returns if r is not None),
                       key=lambda r: r["task"])
        if not tasks:
            merged = ShardWriter(self.out, overwrite=self.overwrite, **self.options).close()
        else:
            try:
                merged = zerowait.merge(self.out, [t["dir"] for t in tasks],
                                        overwrite=self.overwrite, whole_datasets=True)
            except zerowait.ZerowaitError as error:
                raise type(error)(
                    f"{error}\nThe tasks' datasets are in {self.run_dir}/: fix the cause and "
                    f"write again (then delete {self.run_dir}/), or merge them again with "
                    f"zerowait.merge({self.out!r}, [...the task-NNNNNN dirs in order...], "
                    f"whole_datasets=True) or `zerowait merge {self.out} "
                    f"{self.run_dir}/task-NNNNNN... --whole-datasets`") from error
        self.report = {
            "manifest_path": merged["manifest_path"],
            "samples": merged["samples"],
            "shards": merged["shards"],
            "bytes": merged["bytes"] if tasks else merged["bytes_out"],
            "merge_seconds": merged["seconds"],
            "run_dir": self.run_dir if tasks else None,
            "tasks": tasks,
            "quarantined": [q for t in tasks for q in t["quarantined"]],
        }

    def on_write_failed(self, error: Exception) -> None:
        """Says where the parts of the failed write lie: no manifest was published at OUT."""
        log.warning("writing %s failed, and no dataset was published there; the parts its tasks "
                    "wrote are below %s/: delete them, or merge them again once the cause "
                    "is fixed (docs/scale.md, \"Packing beyond one machine\")",
                    self.out, self.run_dir)


def write_dataset(dataset: "ray.data.Dataset", out: Any, *, overwrite: bool = False,
                  shard_size: int = 256 << 20, align: bool = False, verify_images: bool = False,
                  classes: Sequence[str] = (), sync: bool = True,
                  tmp_dir: Optional[Any] = None,
                  ray_remote_args: Optional[Dict[str, Any]] = None,
                  concurrency: Optional[int] = None) -> Dict[str, Any]:
    """Writes every row of the Ray dataset ``dataset`` into one zerowait dataset at ``out``
    (``s3://BUCKET/PREFIX``, or a directory that every node of the cluster mounts) and returns a
    report: manifest_path, samples, shards, bytes, merge_seconds, run_dir, quarantined, and tasks
    (one dict per write task that had rows: task, dir, samples, shards, bytes_out, seconds,
    quarantined, pid, node).

    A row is a sample as :func:`zerowait.write_dataset` takes it: a ``__key__`` column (required
    here: the tasks cannot number the rows globally; keys must be unique across the dataset) and
    one column per field, stored as :func:`zerowait.writer.encode_field` says (bytes, str,
    numbers, NumPy arrays, ...); a null leaves the field out of the sample.

    Each write task writes its rows as a dataset below ``out/ray-RUN/task-NNNNNN/`` (shards
    uploaded as they fill, spooled in ``tmp_dir`` on the worker), then one merge on the driver
    publishes ``out/manifest.json`` listing every task's shards, in task order, without copying
    them. A task or merge that fails publishes no manifest; the parts written stay below
    ``run_dir`` for you to delete. An existing dataset at ``out`` is refused before any task
    runs unless ``overwrite=True`` (its shards are not deleted). ``ray_remote_args`` and
    ``concurrency`` go to ``Dataset.write_datasink``.
    """
    if not overwrite:
        _refuse_existing(out)
    sink = ZerowaitDatasink(out, overwrite=overwrite, shard_size=shard_size, align=align,
                            verify_images=verify_images, classes=list(classes), sync=sync,
                            tmp_dir=tmp_dir)
    dataset.write_datasink(sink, ray_remote_args=ray_remote_args, concurrency=concurrency)
    assert sink.report is not None  # on_write_complete ran on this (the driver's) sink
    return sink.report


def _refuse_existing(out: Any) -> None:
    manifest = f"{os.fspath(out).rstrip('/')}/manifest.json"
    try:
        zerowait.Dataset(manifest, cache_dir=False)
    except zerowait.ZerowaitNotFoundError:
        return
    raise zerowait.AlreadyExistsError(
        f"{manifest} already exists: pass overwrite=True to replace that dataset, or write to "
        "another prefix")


__all__: List[str] = ["ZerowaitDatasink", "write_dataset"]
