"""The training input pipeline as PyTorch users see it: ``zerowait.Loader``.

Everything that costs time runs in C++ worker threads with the GIL released: reads, checksum
checks, JPEG decoding and augmentation, collation. Python receives each batch as a dict of torch
tensors (or numpy arrays): large columns point straight into a native arena, small ones (labels,
``__index__``, anything under 64 KiB a batch) are copies made on the worker, safe to keep.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Union

import numpy as np

from zerowait import _core
from zerowait._paths import local_path
from zerowait.device_copy import DeviceCopy
from zerowait.gpu_decode import GpuDecode, device_fields
from zerowait.map_stage import MapStage, sample_name
from zerowait.text_fields import parse_columns, text_kinds

Array = _core.Array
AudioClip = _core.AudioClip
ImageTransform = _core.ImageTransform
TokenWindow = _core.TokenWindow
_DEFAULTS = _core.LOADER_DEFAULTS  # LoaderOptions' defaults, from the C++ side


def RandomResizedCrop(  # noqa: N802 - named like the torchvision transform it replaces
    size: int,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    flip: bool = False,
    *,
    device: str = "cpu",
    dct_downscale: bool = True,
) -> Any:
    """Decode a JPEG field as torchvision's RandomResizedCrop(size, scale, ratio) would, then,
    with ``flip=True``, RandomHorizontalFlip(). Output: uint8 [size, size, 3]. ``device="cuda"``
    decodes on the GPU (with ``Loader(device="cuda")``; docs/loader.md, "GPU JPEG decode");
    ``dct_downscale=False`` makes the CPU decode at full resolution before resampling."""
    return _placed(ImageTransform(
        "random_resized_crop", size, scale_min=scale[0], scale_max=scale[1],
        ratio_min=ratio[0], ratio_max=ratio[1], flip=flip, dct_downscale=dct_downscale), device)


def CenterCrop(size: int, resize: Optional[int] = None, *, device: str = "cpu",  # noqa: N802
               dct_downscale: bool = True) -> Any:
    """Decode a JPEG field as Resize(resize) + CenterCrop(size) (evaluation). ``resize``
    defaults to round(size * 256 / 224). Output: uint8 [size, size, 3]. ``device`` and
    ``dct_downscale`` as for RandomResizedCrop."""
    return _placed(ImageTransform("center_crop", size, resize=resize or 0,
                                  dct_downscale=dct_downscale), device)


def _placed(transform: ImageTransform, device: str) -> Any:
    """The transform decoded on the loader's CPU threads, or on a GPU by zerowait.gpu_decode."""
    return transform if device == "cpu" else _core.DeviceImageTransform(transform, str(device))


def _default_rank_world() -> tuple[int, int]:
    """torch.distributed when initialised, else RANK / WORLD_SIZE, else a single process."""
    # A process that has not imported torch has no process group; importing it only to ask
    # would cost every Loader() and Checkpointer() of a torch-free job a second or more.
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except ImportError:
            pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _node_and_local_ranks(node: Optional[int], rank: Optional[int],
                          world_size: Optional[int]) -> tuple[int, int, int]:
    """For nodes=N above 1: the node and the rank among the node's ranks, as given, else as
    torchrun sets them (GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE). The global rank would be
    wrong here: with nodes=N, rank/world_size count one node's ranks."""
    given = {"node": node, "rank": rank, "world_size": world_size}
    env = {"node": "GROUP_RANK", "rank": "LOCAL_RANK", "world_size": "LOCAL_WORLD_SIZE"}
    for name, value in given.items():
        if value is None and os.environ.get(env[name], "").isdigit():
            given[name] = int(os.environ[env[name]])
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ValueError(
            f"nodes above 1 needs {', '.join(f'{m}=' for m in missing)}: this node's number and "
            "its rank among the node's ranks (torchrun sets GROUP_RANK, LOCAL_RANK and "
            "LOCAL_WORLD_SIZE, which are used when present)")
    return given["node"], given["rank"], given["world_size"]


def _cuda_pci_bus_id(device: str) -> str:
    """The PCI address ("0000:18:00.0") of the CUDA device batches go to: ``device`` when it
    names one, else torch's current device; "" when torch has no CUDA device."""
    try:
        import torch
    except ImportError:
        return ""
    if not torch.cuda.is_available():
        return ""
    index = torch.device(device).index if device.startswith("cuda") else None
    props = torch.cuda.get_device_properties(
        index if index is not None else torch.cuda.current_device())
    return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


class Loader:
    """Shuffled, rank-partitioned, exactly resumable batches from a zerowait dataset.

    ``data`` is a dataset directory, a manifest.json, a .zws shard, a WebDataset .tar, or a
    :class:`zerowait.Dataset`. Each batch is a dict:

    - ``"__index__"``: int64 [n], the global index of every sample;
    - a raw field ``f``: ``f`` uint8 [total bytes] and ``f.offsets`` int64 [n + 1] (sample i is
      ``batch[f][offsets[i]:offsets[i + 1]]``);
    - ``decode={"cls": "int"}``: int64 [n]; ``decode={"jpg": RandomResizedCrop(224)}``:
      uint8 [n, 224, 224, 3] (normalise on the GPU);
    - ``decode={"tokens": TokenWindow(2048, dtype="uint16")}``: int64 [n, 2048] and
      ``tokens.lengths`` int64 [n] (tokens before the padding);
    - ``"__key__"``: list of str, with ``keys=True``.

    Keeping a batch's labels, ``__index__`` or ``__key__`` holds no loader memory; keeping a large
    column (images, raw bytes) holds its batch's arena: keep ``.clone()`` of it instead.
    ``on_corrupt="raise"`` raises ``CorruptDataError`` once per corrupt sample; iteration goes on
    where it stopped, and the batch comes without that sample (docs/loader.md).

    ``shuffle`` is ``"random"`` (a uniform permutation), ``"block"`` (blocks of about
    ``block_bytes`` read whole, samples shuffled within windows of ``window_bytes``: large reads,
    less mixing), ``"quasi"``, ``"none"``, or ``"auto"``: ``"block"`` for ``s3://`` and
    ``http(s)://`` data, ``"random"`` otherwise (docs/loader.md compares their class mixing).
    With ``shuffle="block"``, ``nodes=N, node=i`` deals the blocks to N nodes by a hash that
    changes only every ``redeal_every`` epochs (0: never): node i reads, and its cache holds,
    the same 1/N of the data each epoch; ``rank``/``world_size`` then count the node's ranks.
    Under torchrun they default to its ``GROUP_RANK`` (the node), ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE``; elsewhere, with ``nodes`` above 1, pass all three.
    The order is a pure function of (seed, epoch): the same on every run, whatever the number
    of threads. Across ``world_size`` ranks each sample appears once per epoch and every rank
    gets the same number of batches (see docs/loader.md for the rule at the end of an epoch).

    Iterating runs the current epoch from where the loader stands; when it ends, the loader
    stands at the start of the next epoch. ``state_dict()`` / ``load_state_dict()`` resume
    exactly, also with a different world size. ``stats()`` reports where time went, including
    ``wait_s``: how long the training loop waited for input.

    Remote datasets (``https://``, ``s3://``) are read through a node-local block cache on
    local disk, shared by every process that uses the same directory (docs/cache.md): by default
    ``zerowait.default_cache_dir()``, capped at a tenth of its file system and at most 64 GiB;
    ``cache_dir=`` names another (``cache_bytes`` caps it, 0 = half the free space) and
    ``cache_dir=False`` reads without one. Local files are never cached. ``stats()["cache"]``
    counts its hits, misses and evictions. A :class:`zerowait.Dataset` lends its cache (or its
    lack of one) to the loader.

    ``map=fn`` runs a Python function on every sample after the C++ stages: ``fn`` gets a dict
    (raw fields as uint8 numpy views, decoded rows as tensors, labels and ``__index__`` as ints,
    ``__seed__``) and returns a dict; equal-shaped arrays are stacked into batch tensors, numbers
    into 1-D tensors, ragged arrays and other objects into lists. It runs in ``map_workers``
    processes (``map_mode="process"``: samples and results pass through shared memory, the
    workers start once; forked unless ``map_start_method`` says otherwise), threads
    (``"thread"``: for functions that release the GIL) or, with ``map_workers=0``, the calling
    thread. Each call's ``sample["__seed__"]`` comes from (seed, epoch, index), and outside
    thread mode ``random``, ``numpy.random`` and ``torch`` are seeded with it: the same
    augmentations after an exact resume, whatever the worker count (threads share those
    generators: there, draw from ``numpy.random.default_rng(sample["__seed__"])``). An
    exception in ``fn`` follows ``on_corrupt`` and names the sample (MapError); a worker that
    dies is reported and replaced and its batches run again, or with
    ``map_on_worker_death="raise"`` MapWorkerError is raised and the loader stands before that
    batch (docs/loader.md, "Per-sample Python"). Process mode's files live in /dev/shm; where it
    is too small for them (a container's is 64 MiB by default) the batches that do not fit pass
    through a folder under $TMPDIR instead, said once (RuntimeWarning) and counted in
    ``stats()["map"]["shared_fallbacks"]``. ``map_dir`` names the folder to use instead of
    /dev/shm; a full one is a MapError naming the fix.

    ``numa`` places the loader on one NUMA node: its threads run on that node's CPUs and its
    batch arenas live in that node's memory. ``"auto"``: the node the CUDA device is attached to
    (``device``'s, else torch's current one), when sysfs says; an int: that node (ValueError when
    it does not exist); None (default): nothing changes. ``stats()["numa"]`` says what was done,
    or why not (docs/loader.md, "NUMA placement").

    ``device="cuda"`` (or ``"cuda:N"``) delivers every tensor on that GPU: the batch arenas are
    page-locked and each batch is copied on a side stream while the GPU works on the one before;
    the caller's stream waits on the copy's event, never the CPU, and an arena goes back to the
    pool only once its copy has finished. ``out`` (with a CUDA device): preallocated device
    tensors by column name that those columns are copied into every step instead of new
    tensors (fixed addresses, for loops captured as CUDA graphs); a batch of n samples fills
    ``out[name][:n]``. ``stats()["h2d"]`` times the copies on the GPU's clock: ``copy_s``,
    ``wait_s`` (the caller's stream stalled on an unfinished copy, which the StepProfiler counts
    as ``h2d``), ``bytes`` and ``gb_per_s``.

    ``poison_released=True`` fills every arena with a pattern (0xA5) the moment it returns to
    the pool: a batch read after its release (a copy still in flight, a zero-copy view kept past
    the batch) then reads garbage that a comparison catches. For tests and debugging; it costs a
    memset per batch.

    ``memory_budget`` bounds the batch arenas together, in bytes. None (default): room for
    ``threads + prefetch + 2`` batches (twice the estimate each, so an unusually large batch
    grows in place), at least 512 MiB and at most a quarter of the memory available (and of the
    room under the process's cgroup ``memory.max``), shared by ``LOCAL_WORLD_SIZE`` ranks;
    ``stats()["memory_budget"]`` says what was chosen.
    """

    def __init__(
        self,
        data: Any,
        batch_size: int = _DEFAULTS["batch_size"],
        *,
        shuffle: Any = "auto",
        seed: int = 0,
        epoch: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = _DEFAULTS["drop_last"],
        threads: Optional[int] = None,
        prefetch: int = _DEFAULTS["prefetch"],
        memory_budget: Optional[int] = None,
        io: str = "auto",
        on_corrupt: str = _DEFAULTS["on_corrupt"],
        fields: Optional[Sequence[str]] = None,
        decode: Optional[Dict[str, Any]] = None,
        keys: bool = _DEFAULTS["keys"],
        verify: bool = _DEFAULTS["verify"],
        read_timeout: float = _DEFAULTS["read_timeout"],
        shuffle_block: int = _DEFAULTS["shuffle_block"],
        shuffle_window: int = _DEFAULTS["shuffle_window"],
        block_bytes: int = _DEFAULTS["block_bytes"],
        window_bytes: int = _DEFAULTS["window_bytes"],
        nodes: int = 1,
        node: Optional[int] = None,
        redeal_every: int = 0,
        autotune: bool = _DEFAULTS["autotune"],
        cache_dir: Union[None, bool, str, "os.PathLike[str]"] = None,
        cache_bytes: int = 0,
        device: str = "cpu",
        output: str = "torch",
        map: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,  # noqa: A002
        map_workers: int = 2,
        map_mode: str = "process",
        map_prefetch: int = 2,
        map_on_worker_death: str = "retry",
        map_start_method: Optional[str] = None,
        map_dir: Optional[str] = None,
        numa: Any = None,
        out: Optional[Dict[str, Any]] = None,
        poison_released: bool = False,
    ) -> None:
        if isinstance(data, _core.Dataset):
            # The loader reads the dataset's files through the dataset's own cache, unless
            # given one.
            if cache_dir is None:
                cache_dir = data.cache_dir if data.cache_dir is not None else False
                cache_bytes = data.cache_bytes
            data = data.path
        if map_dir is not None:
            map_dir = local_path(map_dir, "map_dir")
        if shuffle == "auto":
            # Remote data is read in whole blocks: one request per block instead of per sample.
            remote = isinstance(data, str) and data.startswith(("s3://", "http://", "https://"))
            shuffle = "block" if remote else _DEFAULTS["shuffle"]
        elif shuffle is True:
            shuffle = "random"
        elif shuffle is False or shuffle is None:
            shuffle = "none"
        if nodes > 1:
            node, rank, world_size = _node_and_local_ranks(node, rank, world_size)
        elif node is None:
            node = 0
        if rank is None or world_size is None:
            default_rank, default_world = _default_rank_world()
            rank = default_rank if rank is None else rank
            world_size = default_world if world_size is None else world_size
        if output not in ("torch", "numpy"):
            raise ValueError(f"output must be 'torch' or 'numpy', not {output!r}")
        self._device = str(device)
        self._output = output
        if self._device != "cpu" and output != "torch":
            raise ValueError("device other than 'cpu' needs output='torch'")
        if out is not None and self._device == "cpu":
            raise ValueError("out= holds device buffers: it needs device='cuda'")
        # Arenas are page-locked only for the loader's own device copy, which holds each host
        # batch until its copy has finished; pinned memory handed to a caller's own
        # non_blocking copy could return to the pool while the copy still reads it.
        pin_memory = self._device.startswith("cuda")
        if pin_memory:
            # torch first: a CUDA build loads its libcudart, which the arenas' pinning then
            # shares (the C++ side takes a copy already loaded before looking for one itself).
            import torch  # noqa: F401
        if not (numa is None or numa == "auto"
                or (isinstance(numa, int) and not isinstance(numa, bool))):
            raise ValueError(f"numa must be None, 'auto' or a node number, not {numa!r}")
        gpu_pci_bus_id = _cuda_pci_bus_id(self._device) if numa == "auto" else ""
        gpu_fields = device_fields(decode)
        if gpu_fields and map is not None:
            raise ValueError("GPU image decode (device='cuda' on a transform) does not combine "
                             "with map= yet")
        self._gpu = GpuDecode(gpu_fields, self._device) if gpu_fields else None
        if self._gpu is not None:
            decode = self._gpu.core_decode(decode)
        options = dict(
            batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
            world_size=world_size, drop_last=drop_last, threads=threads or 0, prefetch=prefetch,
            memory_budget=memory_budget or 0, io=io, on_corrupt=on_corrupt,
            fields=list(fields) if fields is not None else None, decode=decode, keys=keys,
            verify=verify, read_timeout=read_timeout, shuffle_block=shuffle_block,
            shuffle_window=shuffle_window, block_bytes=block_bytes, window_bytes=window_bytes,
            nodes=nodes, node=node, redeal_every=redeal_every,
            autotune=autotune, pin_memory=pin_memory,
            cache_dir=cache_dir,
            cache_bytes=cache_bytes, numa=numa, numa_gpu_pci_bus_id=gpu_pci_bus_id,
            poison_released=poison_released)
        self._text = text_kinds(decode)
        self._on_corrupt = on_corrupt
        # A batch held back while a corrupt text/json sample is raised first, with the state
        # before it: (state, batch).
        self._ready: Optional[tuple] = None
        self._errors: list = []
        self._skipped_in_python = 0
        # The map workers are forked before the C++ loader starts its threads.
        self._map = (MapStage(map, workers=map_workers, mode=map_mode, seed=seed,
                              on_corrupt=on_corrupt, on_worker_death=map_on_worker_death,
                              prefetch=map_prefetch, start_method=map_start_method, keys=keys,
                              as_torch=output == "torch", text=self._text, shared_dir=map_dir)
                     if map is not None else None)
        try:
            self._loader = _core._Loader(data, options)
        except BaseException:
            if self._map is not None:
                self._map.close()
            raise
        if self._map is not None:
            self._map.attach(self._loader)
        self._keys = keys
        self.rank = rank
        self.world_size = world_size
        self.batch_size = batch_size
        self._copy = (DeviceCopy(self._device, self._loader.stats()["arenas"], out)
                      if self._device != "cpu" else None)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        # An iterator object, not a generator: an exception (a corrupt sample with
        # on_corrupt="raise") would end a generator for good, while this one goes on where it
        # stopped on the next next().
        return _EpochIterator(self)

    def next(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The next batch, or None at the end of the epoch. With ``timeout`` (seconds), raises
        DeadlineExceededError when no batch is ready by then; nothing is lost, and the next call
        waits for the same batch."""
        if self._map is not None:
            batch = self._map.next(timeout)
            return self._copy(batch) if batch is not None and self._copy is not None else batch
        if self._errors:
            raise self._errors.pop(0)
        if self._ready is not None:
            batch, self._ready = self._ready[1], None
            return batch
        state = self._loader.state_dict() if self._text or self._gpu is not None else None
        arrays = self._loader.next(timeout)
        if arrays is None:
            return None
        failed: list = []
        if self._text:
            arrays, failed = parse_columns(arrays, self._text)
        if self._gpu is not None:
            arrays, failed_on_gpu = self._gpu(arrays)
            failed += failed_on_gpu
        if failed:
            self._skipped_in_python += len(failed)
            if self._on_corrupt == "raise":
                self._errors = [_core.CorruptDataError(
                    f"{sample_name(dict(index=i, **self._loader.describe_sample(i)))}: {reason}")
                    for i, reason in failed]
        if self._keys and "__key__" not in arrays:
            arrays["__key__"] = []
        batch = arrays
        if self._output == "torch":
            import torch

            batch = {name: (torch.from_numpy(a) if isinstance(a, np.ndarray) else a)
                     for name, a in arrays.items()}
            if self._copy is not None:
                batch = self._copy(batch)
        if self._errors:  # raised first, as for the C++ stages; the batch comes next
            self._ready = (state, batch)
            raise self._errors.pop(0)
        return batch


    def __len__(self) -> int:
        """Batches this rank gets in a whole epoch."""
        return self._loader.batches_per_epoch()

    def remaining(self) -> int:
        """Batches this rank still gets in the current epoch."""
        pending = self._map.pending() if self._map is not None else 0
        return self._loader.remaining_batches() + pending + (self._ready is not None)

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    @property
    def wait_s(self) -> float:
        """Seconds next() has kept the training loop waiting since creation, the ``map=``
        stage's wait included (the two are disjoint). Cheap enough to read every step, unlike
        stats(), which copies every counter and with process-mode ``map=`` also measures every
        worker's memory."""
        return self._loader.wait_s + (self._map.wait_s if self._map is not None else 0.0)

    @property
    def h2d_wait_s(self) -> float:
        """Seconds the caller's CUDA stream stalled on this loader's copies, on the GPU's clock
        (copies timed so far; 0.0 without a device). What the StepProfiler counts as ``h2d``."""
        if self._copy is None:
            return 0.0
        self._copy.poll()
        return self._copy.wait_s

    def set_epoch(self, epoch: int) -> None:
        """Restart at the beginning of ``epoch``."""
        self._ready, self._errors = None, []
        if self._map is not None:
            self._map.set_epoch(epoch)
        else:
            self._loader.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands, counting the batches already returned: a plain dict that
        torch.save / json can store."""
        if self._ready is not None:
            return dict(self._ready[0])
        return self._map.state_dict() if self._map is not None else self._loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken; world size and batch size may differ."""
        self._ready, self._errors = None, []
        if self._map is not None:
            self._map.load_state_dict(dict(state))
        else:
            self._loader.load_state_dict(dict(state))

    def stats(self) -> Dict[str, Any]:
        """Totals since creation (``wait_s``: time blocked in next(), ``read_s``, ``decode_s``,
        ``bytes_read``, ``skipped``, ...), pool state, and ``recent``: the last steps. With
        ``map=``, ``map`` adds the stage's: ``wait_s`` (time next() waited on fn's results),
        ``fn_s`` (time in fn, all workers), ``samples``, ``errors``, ``worker_deaths`` and the
        last ``deaths``, and in process mode ``worker_rss_bytes`` and ``worker_unique_bytes`` (the
        part not shared with the training process)."""
        stats = self._loader.stats()
        stats["skipped"] += self._skipped_in_python
        if self._copy is not None:
            stats["h2d"] = self._copy.stats()
        if self._map is not None:
            stats["map"] = self._map.stats()
        if self._gpu is not None:
            stats["gpu_decode"] = self._gpu.stats()
        return stats

    def close(self) -> None:
        """Stop the worker threads (and map workers). Batches already returned stay valid."""
        if self._map is not None:
            self._map.close()
        self._loader.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _EpochIterator:
    """The rest of the loader's current epoch, batch by batch; survives a raised error."""

    def __init__(self, loader: Loader) -> None:
        self._loader: Optional[Loader] = loader

    def __iter__(self) -> "_EpochIterator":
        return self

    def __next__(self) -> Dict[str, Any]:
        if self._loader is None:  # exhausted iterators stay exhausted
            raise StopIteration
        batch = self._loader.next()
        if batch is None:
            self._loader = None
            raise StopIteration
        return batch
