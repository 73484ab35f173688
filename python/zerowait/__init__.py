"""zerowait: removes the time a GPU spends waiting on I/O.

Pack trees of small files into large indexed shards, then read samples back by index:

    >>> import zerowait
    >>> report = zerowait.pack("images/", "shards/", imagefolder=True)
    >>> ds = zerowait.Dataset("shards/")
    >>> sample = ds[0]                      # {"jpg": b"...", "cls": b"3"}
    >>> ds.classes[int(sample["cls"])]      # the class directory name

or write the samples of a table or a generator into the same kind of dataset:

    >>> zerowait.write_dataset(({"jpg": row.image, "cls": row.label} for row in rows), "shards/")

Save and restore training state without stalling the training loop:

    >>> ckpt = zerowait.Checkpointer("ckpt/", keep_last=3)
    >>> handle = ckpt.save(step, {"model": model.state_dict(), "step": step})
    >>> state = ckpt.load(into={"model": model.state_dict()})   # newest valid step, in place

Everything here is implemented in C++ (``zerowait._core``); blocking calls release the GIL.
Errors derive from :class:`ZerowaitError` and from the matching built-in exception
(``FileNotFoundError``, ``ValueError``, ``TimeoutError``, ...), so ordinary ``except`` clauses
work. The ``zerowait`` command installed beside this package offers the same operations.
"""

from zerowait._core import (
    AlreadyExistsError,
    CancelledError,
    CorruptDataError,
    Dataset,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnsupportedError,
    ZerowaitError,
    ZerowaitIOError,
    ZerowaitNotFoundError,
    __version__,
    default_cache_dir,
    generate_imagefolder,
    merge,
    pack,
)
from zerowait.checkpoint import Checkpointer, SaveHandle
from zerowait.gds import read_into, read_to_device
from zerowait.loader import (
    Array,
    AudioClip,
    CenterCrop,
    ImageTransform,
    Loader,
    RandomResizedCrop,
    TokenWindow,
)
from zerowait.map_stage import MapError, MapWorkerError
from zerowait.profiler import StepProfiler
from zerowait.writer import ShardWriter, token_windows, write_dataset
from zerowait import metrics  # zerowait.metrics.render / write_textfile / serve

__all__ = [
    "AlreadyExistsError",
    "Array",
    "AudioClip",
    "CancelledError",
    "CenterCrop",
    "Checkpointer",
    "CorruptDataError",
    "Dataset",
    "DeadlineExceededError",
    "ImageTransform",
    "InternalError",
    "InvalidArgumentError",
    "Loader",
    "MapError",
    "MapWorkerError",
    "RandomResizedCrop",
    "ResourceExhaustedError",
    "SaveHandle",
    "TokenWindow",
    "ShardWriter",
    "StepProfiler",
    "UnsupportedError",
    "ZerowaitError",
    "ZerowaitIOError",
    "ZerowaitNotFoundError",
    "__version__",
    "default_cache_dir",
    "generate_imagefolder",
    "merge",
    "pack",
    "read_into",
    "read_to_device",
    "token_windows",
    "write_dataset",
]
