"""Reading file bytes straight into GPU memory: through NVIDIA cuFile (GPUDirect Storage) where
it works, else through zerowait's own POSIX path (O_DIRECT reads into pinned bounce buffers,
copied to the GPU on a side stream while the next read runs), the way RAPIDS KvikIO does.

    >>> import torch, zerowait
    >>> weights = torch.empty(1 << 20, dtype=torch.bfloat16, device="cuda")
    >>> zerowait.read_into(weights, "model.bin", offset=4096)          # gds="auto"
    >>> data, offsets = zerowait.read_to_device("shards/", [3, 17, 42], "jpg")

``gds`` picks the path: ``"auto"`` (cuFile when its library loads, its driver opens, the file
registers and the first read works; otherwise the POSIX path, said once on stderr and counted in
``stats()["gds_fallbacks"]``), ``"on"`` (cuFile or an ``UnsupportedError`` saying why) or
``"off"`` (the POSIX path). Where cuFile works but the nvidia-fs kernel module is absent, cuFile
itself reads through host memory (its compatibility mode): ``stats()["cufile_compat_mode"]`` says
so and :func:`evidence` shows why. docs/io.md describes both paths.

The nvidia-cufile wheel's ``libcufile.so.0`` is loaded (with RTLD_GLOBAL) before the first read,
so that zerowait's C++ core finds it; ``$ZEROWAIT_CUFILE_LIBRARY`` names another.

Reads do not follow CUDA stream order: each call first synchronizes the destination device's
current stream (so that no queued kernel still uses the memory), and returns once the bytes are
in GPU memory.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Tuple

from zerowait import _core
from zerowait._paths import local_path

_preloaded: Optional[str] = None  # what _preload_cufile found: a library path, or why not


def wheel_library() -> Tuple[Optional[str], str]:
    """The nvidia-cufile wheel's libcufile.so.0 and the wheel's name, or (None, why not). CUDA 13
    wheels keep it in nvidia/cu13/lib, CUDA 12 ones in nvidia/cufile/lib: the wheel's own list of
    files says where."""
    from importlib import metadata

    for wheel in ("nvidia-cufile", "nvidia-cufile-cu12"):
        try:
            files = metadata.files(wheel) or []
        except metadata.PackageNotFoundError:
            continue
        for file in files:
            if file.name == "libcufile.so.0":
                return str(Path(str(file.locate())).resolve()), wheel
        return None, f"the {wheel} wheel lists no libcufile.so.0"
    return None, "no nvidia-cufile wheel is installed"


def _preload_cufile() -> str:
    """Loads the nvidia-cufile wheel's libcufile once, globally, so that the C++ core's dlopen
    of libcufile.so.0 finds it. Returns the library's path, or why none was loaded."""
    global _preloaded
    if _preloaded is not None:
        return _preloaded
    if os.environ.get("ZEROWAIT_CUFILE_LIBRARY"):
        _preloaded = "not preloaded: $ZEROWAIT_CUFILE_LIBRARY names the library"
        return _preloaded
    library, wheel = wheel_library()
    if library is None:
        _preloaded = wheel
        return _preloaded
    try:
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        _preloaded = f"{library} (from {wheel}) does not load: {e}"
    else:
        _preloaded = library
    return _preloaded


def _torch() -> Any:
    import torch  # the device paths need torch; the rest of zerowait does not

    return torch


def _cuda_bytes(tensor: Any, what: str) -> Tuple[int, int]:
    """(address, byte size) of a contiguous CUDA tensor, after synchronizing its device's current
    stream; ValueError naming `what` otherwise."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not {type(tensor).__name__}")
    if not tensor.is_cuda:
        raise ValueError(f"{what} must be a CUDA tensor (it is on {tensor.device}): zerowait.gds "
                         "reads into GPU memory; read host tensors with ordinary file reads")
    if not tensor.is_contiguous():
        raise ValueError(f"{what} must be contiguous")
    torch.cuda.current_stream(tensor.device).synchronize()
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


class GdsReader:
    """A local file open for reads into GPU memory. Use as a context manager, or close().

    ``direct=False`` makes the POSIX path read through the page cache (for files read again
    soon); ``bounce_bytes`` sizes each of its two pinned bounce buffers. Reads on one reader are
    serialized; open one per thread to read in parallel. Raises ZerowaitNotFoundError for a
    missing file and, with ``gds="on"``, UnsupportedError saying why cuFile cannot be used.
    """

    def __init__(self, path: Any, gds: str = "auto", *, direct: bool = True,
                 bounce_bytes: int = 8 << 20) -> None:
        path = local_path(path, "path")
        if gds != "off":
            _preload_cufile()
        self._reader = _core.GdsReader(path, gds, direct, bounce_bytes)

    def __enter__(self) -> "GdsReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._reader.close()

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        return self._reader.size

    def read_into(self, tensor: Any, offset: int = 0, nbytes: Optional[int] = None, *,
                  timeout: Optional[float] = None) -> Any:
        """Fills the first ``nbytes`` bytes of CUDA ``tensor`` (all of them by default) with the
        file's bytes from ``offset``; returns ``tensor``. CorruptDataError "short read" when the
        file ends first; DeadlineExceededError after ``timeout`` seconds (checked between chunks
        of up to 1 GiB with cuFile, 8 MiB with the POSIX path)."""
        address, size = _cuda_bytes(tensor, "tensor")
        nbytes = size if nbytes is None else nbytes
        if not 0 <= nbytes <= size:
            raise ValueError(f"nbytes={nbytes} does not fit the tensor's {size} bytes")
        self._reader.read(address, nbytes, offset, timeout)
        return tensor

    def read_batch(self, requests: Sequence[Tuple[int, int, Any, int]], *,
                   timeout: Optional[float] = None) -> None:
        """Reads many ranges at once: ``requests`` holds ``(offset, nbytes, tensor,
        byte_offset)``, each filling ``nbytes`` bytes of CUDA ``tensor`` from ``byte_offset`` on
        with the file's bytes from ``offset``."""
        batch, seen = [], {}
        for offset, nbytes, tensor, byte_offset in requests:
            if id(tensor) not in seen:
                seen[id(tensor)] = _cuda_bytes(tensor, "a batch's tensor")
            address, size = seen[id(tensor)]
            if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > size:
                raise ValueError(f"{nbytes} bytes at byte {byte_offset} do not fit a tensor of "
                                 f"{size} bytes")
            batch.append((offset, nbytes, address + byte_offset))
        self._reader.read_batch(batch, timeout)

    def stats(self) -> dict:
        """path ("cufile" or "posix"), reason (why), cufile_compat_mode, direct, requests,
        cufile_bytes, posix_bytes, gds_fallbacks, direct_fallbacks."""
        return self._reader.stats()


def read_into(tensor: Any, path: Any, offset: int = 0, nbytes: Optional[int] = None, *,
              gds: str = "auto", timeout: Optional[float] = None) -> Any:
    """Fills CUDA ``tensor``'s bytes (its first ``nbytes``, by default all) with the bytes of the
    file at ``path`` from ``offset``, and returns ``tensor``: a checkpoint's tensor restored
    straight into GPU memory. See GdsReader.read_into for the errors."""
    with GdsReader(path, gds) as reader:
        return reader.read_into(tensor, offset, nbytes, timeout=timeout)


class DatasetDeviceReader:
    """One field of chosen samples of a local dataset, read straight into GPU memory, with a
    reader per shard kept open between calls. ``dataset``: a zerowait.Dataset or its path.

    Checksums are NOT verified on this path: a sample's checksum covers all of its fields and
    the bytes never pass through the CPU. Verify a dataset with ``Dataset.verify()`` (or read
    through ``Dataset(..., verify=True)``) where corruption is a concern.
    """

    def __init__(self, dataset: Any, gds: str = "auto", *, direct: bool = True) -> None:
        if gds != "off":
            _preload_cufile()
        path = dataset.path if isinstance(dataset, _core.Dataset) else dataset
        path = local_path(path, "dataset")
        self._reader = _core.GdsDatasetReader(path, gds, direct)

    def __len__(self) -> int:
        return len(self._reader)

    def read(self, indices: Sequence[int], field: str, *, device: Any = "cuda",
             timeout: Optional[float] = None) -> Tuple[Any, Any]:
        """Returns ``(data, offsets)``: ``data`` a uint8 tensor on ``device`` holding the
        field's bytes of each sample in ``indices`` order, back to back, and ``offsets`` an int64
        CPU tensor of ``len(indices) + 1`` entries (sample i is ``data[offsets[i]:offsets[i +
        1]]``), as the loader's raw fields are. Negative indices count from the end. A sample
        without ``field`` raises InvalidArgumentError naming it."""
        torch = _torch()
        n = len(self._reader)
        resolved = []
        for i in indices:
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise IndexError(f"dataset index {i} out of range ({n} samples)")
            resolved.append(j)
        sizes = self._reader.sizes(resolved, field)
        offsets = torch.zeros(len(sizes) + 1, dtype=torch.int64)
        if sizes:
            offsets[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)
        data = torch.empty(int(offsets[-1]), dtype=torch.uint8, device=device)
        if data.numel() > 0:
            address, _ = _cuda_bytes(data, "the destination")
            self._reader.read(resolved, field, address, offsets[:-1].tolist(), timeout)
        return data, offsets

    def stats(self) -> dict:
        """GdsReader.stats() summed over the shards read so far, plus shards_open."""
        return self._reader.stats()


def read_to_device(dataset: Any, indices: Sequence[int], field: str, *, device: Any = "cuda",
                   gds: str = "auto", timeout: Optional[float] = None) -> Tuple[Any, Any]:
    """DatasetDeviceReader(dataset, gds).read(indices, field): one field of some samples in GPU
    memory as ``(data, offsets)``. Checksums are not verified (see DatasetDeviceReader)."""
    return DatasetDeviceReader(dataset, gds).read(indices, field, device=device, timeout=timeout)


def evidence() -> dict:
    """What this machine says about GPUDirect Storage: ``cufile_usable``, ``compat_mode`` (cuFile
    reads through host memory: no nvidia-fs), ``summary`` (one line), ``facts`` (library,
    cufile_version, driver, nvidia_fs, nvfs_version, allow_compat_mode, force_compat_mode,
    cufile_json, run_udev, cufile_log, cuda) and ``preload`` (the wheel's library loaded, or why
    not)."""
    preload = _preload_cufile()
    result = _core.gds_evidence()
    result["preload"] = preload
    return result
