"""Lightning checkpoints through zerowait: ``zerowait.lightning.CheckpointIO``.

``Trainer(plugins=[zerowait.lightning.CheckpointIO()])`` makes every checkpoint Lightning saves
(ModelCheckpoint's, ``trainer.save_checkpoint``'s) a zerowait step: ``save_checkpoint`` returns
once the state is copied into the staging pool, and the files are written, checksummed and
committed in the background. The file Lightning names (``epoch=0-step=10.ckpt``, ``last.ckpt``)
becomes a small JSON *pointer* naming the step, written once the step is committed, so that
ModelCheckpoint's checks (``fsspec`` exists, listing ``last*.ckpt`` by modification time) see
real files and never one that names a step still being written. docs/checkpoint.md, "Lightning".
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from typing import Any, Dict, List, Optional, Tuple

# Trainer(plugins=[...]) takes a checkpoint plugin only as a subclass of this class.
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _LightningCheckpointIO

from zerowait import _core
from zerowait.checkpoint import Checkpointer

POINTER_FORMAT = "zerowait-lightning-checkpoint"
POINTER_VERSION = 1
_MAX_POINTER_BYTES = 1 << 16  # a pointer is a few hundred bytes; a larger file is not one
_COMMIT_RECORD = "manifest.json"  # the engine's name for a step's commit record


class CheckpointIO(_LightningCheckpointIO):
    """A Lightning ``CheckpointIO`` that saves each checkpoint as a step of a
    :class:`zerowait.Checkpointer`: asynchronous, atomic and checksum-verified.

    - ``directory``: where the steps live (a local directory); None: a ``zerowait`` folder
      beside each checkpoint file (``<ModelCheckpoint dirpath>/zerowait``). Each save is the
      directory's next step number (not the global step: ``last.ckpt`` is saved at the same
      global step as the top-k checkpoint); the pointer records the step, the run, the epoch
      and the global step.
    - ``allow_pickle``: pickle values that are not tensors, numpy arrays, plain values or
      dicts/lists/tuples of them (Lightning's own entries need it only for hyper-parameters
      that are not plain values, such as a ``Path``; an object a callback or
      ``on_save_checkpoint`` puts in may), and unpickle them on load.
      ``load_checkpoint(weights_only=True)`` refuses pickled values, ``weights_only=False``
      allows them, None follows ``allow_pickle``.
    - ``compression``, ``incremental``, ``max_file_bytes``, ``threads``, ``direct_reads``,
      ``read_timeout``: as for :class:`zerowait.Checkpointer`. Retention is ModelCheckpoint's
      (``save_top_k``): a checkpoint it removes is removed as a zerowait step too.

    ``save_checkpoint`` waits for the previous save to finish (one snapshot in memory at a
    time), so wrapping this plugin in Lightning's ``AsyncCheckpointIO`` adds nothing but a
    second copy of the state. ``teardown()`` (Lightning calls it at the end of ``fit``) waits for
    the save in flight and raises its error. Saves happen where Lightning calls the plugin: on
    global rank 0, with the state that rank holds (single device, DDP).

    Not thread-safe: Lightning calls it from the training loop's thread.
    """

    def __init__(
        self,
        directory: Any = None,
        *,
        allow_pickle: bool = False,
        compression: Optional[str] = None,
        incremental: bool = False,
        max_file_bytes: Optional[int] = None,
        threads: int = 0,
        direct_reads: bool = True,
        read_timeout: Optional[float] = None,
    ) -> None:
        super().__init__()
        self.directory = (None if directory is None
                          else os.path.realpath(_local_path(directory, "directory")))
        self.allow_pickle = allow_pickle
        self._options = dict(compression=compression, incremental=incremental,
                             max_file_bytes=max_file_bytes, threads=threads,
                             direct_reads=direct_reads, read_timeout=read_timeout)
        # By real path: two Checkpointers on one directory would not know of each other's saves.
        self._checkpointers: Dict[str, Checkpointer] = {}
        self._next_step: Dict[str, int] = {}
        self._publishing: Optional[_Publication] = None  # the save in flight
        # Steps no pointer names any more: (directory, step, run_id). The publication thread
        # adds to it; retired only while no save is in flight (see _retire_unnamed).
        self._unnamed: List[Tuple[str, int, str]] = []
        self._lock = threading.Lock()  # pointer files and _unnamed, shared with that thread

    # --- Lightning's interface -----------------------------------------------------------------

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any,
                        storage_options: Optional[Any] = None) -> None:
        """Snapshots ``checkpoint`` as the next step and returns; the pointer file ``path``
        appears (or is replaced) once the step is committed. Raises TypeError, naming the key
        path, for a value that cannot be saved, and the error of an earlier save that failed
        in the background."""
        if storage_options is not None:
            raise TypeError(f"storage_options is not supported by {type(self).__qualname__} "
                            f"(got {storage_options!r})")
        path = _local_path(path, "checkpoint path")
        self._settle()
        folder = os.path.realpath(os.path.dirname(path))
        directory = self.directory or os.path.realpath(os.path.join(folder, "zerowait"))
        checkpointer = self._checkpointer(directory)
        step = self._take_step(directory)
        handle = checkpointer.save(step, checkpoint)
        pointer = {"format": POINTER_FORMAT, "version": POINTER_VERSION,
                   "directory": _pointer_directory(directory, folder), "step": step,
                   "run_id": checkpointer.run_id, "epoch": checkpoint.get("epoch"),
                   "global_step": checkpoint.get("global_step")}
        self._publishing = _Publication(self, handle, path, pointer, directory)
        self._publishing.start()

    def load_checkpoint(self, path: Any, map_location: Any = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """The checkpoint the pointer ``path`` names, every tensor verified while it is read.
        ``map_location``: a device or its name (None: the device each tensor was saved from).

        Raises FileNotFoundError when ``path`` does not exist or its step is not in the
        directory, CorruptDataError (a ValueError) naming the file and tensor for a damaged
        step, ValueError for a file that is not a pointer or a step another run saved."""
        if callable(map_location) or isinstance(map_location, dict):
            raise TypeError("map_location must be a device, a device name or None for zerowait "
                            "checkpoints, not a function or a dict")
        path = _local_path(path, "checkpoint path")
        if self._publishing is not None and self._publishing.names(path):
            self._settle()  # saved by this process: its name appears once it is committed
        pointer = _read_pointer(path)
        directory, step = _pointer_target(pointer, path)
        checkpointer = self._checkpointer(directory)
        saved_allow_pickle = checkpointer.allow_pickle
        checkpointer.allow_pickle = self.allow_pickle if weights_only is None else not weights_only
        try:
            state = checkpointer.load(step, map_location=map_location, fallback=False)
        except _core.ZerowaitNotFoundError as error:
            raise _core.ZerowaitNotFoundError(
                f"{path} names step {step} of {directory}, which is not there (removed, or "
                f"its save never committed): {error}") from error
        except _core.ZerowaitError as error:  # CorruptDataError, ZerowaitIOError, ...
            raise type(error)(f"{path} names step {step} of {directory}, which cannot be "
                              f"loaded: {error}") from error
        except ValueError as error:  # a pickled value refused
            raise ValueError(f"{path}: {error} (for this plugin: load_checkpoint(..., "
                             f"weights_only=False) or CheckpointIO(allow_pickle=True))") from error
        finally:
            checkpointer.allow_pickle = saved_allow_pickle
        if checkpointer.loaded_run_id != pointer["run_id"]:
            raise ValueError(f"{path} names step {step} of {directory} as saved by run "
                             f"{pointer['run_id']}, but that step was saved by run "
                             f"{checkpointer.loaded_run_id}")
        return state

    def remove_checkpoint(self, path: Any) -> None:
        """Removes the file ``path`` and, when it is a pointer (not a link to one), retires the
        step it names: at once when no save is in flight, else before the next save starts (or
        at teardown), so that removal never races a save."""
        path = _local_path(path, "checkpoint path")
        if self._publishing is not None and self._publishing.names(path):
            self._settle()
        with self._lock:
            if os.path.islink(path):
                os.remove(path)  # a name for another pointer (save_last="link"), which stays
            elif os.path.isdir(path):
                shutil.rmtree(path)  # not ours: removed as Lightning's own CheckpointIO does
            elif os.path.exists(path):
                try:
                    pointer: Optional[Dict[str, Any]] = _read_pointer(path)
                except ValueError:
                    pointer = None  # a file of another CheckpointIO: removed all the same
                os.remove(path)
                _fsync_directory(os.path.dirname(path))
                if pointer is not None:
                    directory, step = _pointer_target(pointer, path)
                    self._unnamed.append((directory, step, pointer["run_id"]))
        if self._publishing is None or not self._publishing.is_alive():
            self._retire_unnamed()

    def teardown(self) -> None:
        """Waits for the save in flight and names it, retires removed steps, and closes the
        Checkpointers (the plugin can be used again: they reopen). Raises a save's error."""
        try:
            self._settle()
        finally:
            checkpointers, self._checkpointers = self._checkpointers, {}
            for checkpointer in checkpointers.values():
                checkpointer.close()

    # --- internals -----------------------------------------------------------------------------

    def _checkpointer(self, directory: str) -> Checkpointer:
        checkpointer = self._checkpointers.get(directory)
        if checkpointer is None:
            # Rank 0 of one: Lightning hands the plugin rank 0's whole state, while
            # torch.distributed would make the Checkpointer wait for every rank's part.
            checkpointer = Checkpointer(directory, rank=0, world_size=1,
                                        allow_pickle=self.allow_pickle, **self._options)
            self._checkpointers[directory] = checkpointer
        return checkpointer

    def _take_step(self, directory: str) -> int:
        """The directory's next step number: above every step there, committed, retired or
        being written (a retired step's folder may remain, holding files a newer step uses)."""
        step = self._next_step.get(directory)
        if step is None:
            numbers = [_step_number(name) for name in os.listdir(directory)]
            step = 1 + max((n for n in numbers if n is not None), default=0)
        self._next_step[directory] = step + 1
        return step

    def _settle(self) -> None:
        """Waits for the save in flight and its pointer, retires unnamed steps (no save is in
        flight now), and raises the save's error if it failed."""
        publishing, self._publishing = self._publishing, None
        if publishing is not None:
            publishing.wait_on_saving_thread()
            publishing.join()
        self._retire_unnamed()
        if publishing is not None and publishing.error is not None:
            raise publishing.error

    def _retire_unnamed(self) -> None:
        """Retires the steps no pointer names, as the engine's retention does: the commit record
        goes first (durably), then collect_garbage deletes the files no committed step uses.
        Written here because the bindings offer retention by count only, not by step; called
        only while no save is in flight, since an incremental save may reference the step."""
        with self._lock:
            unnamed, self._unnamed = self._unnamed, []
        directories = set()
        for directory, step, run_id in unnamed:
            try:
                saver = _core._ckpt_step_info(directory, step)["run_id"]
            except _core.ZerowaitNotFoundError:
                continue  # already retired, or never committed
            except _core.ZerowaitError:
                saver = run_id  # a damaged commit record: the step goes all the same
            if saver != run_id:
                continue  # another run's step of that number: not the one the pointer named
            step_dir = os.path.join(directory, f"step-{step}")
            os.remove(os.path.join(step_dir, _COMMIT_RECORD))
            _fsync_directory(step_dir)
            directories.add(directory)
        for directory in sorted(directories):
            _core._ckpt_gc(directory)

    def __repr__(self) -> str:
        where = self.directory or "<checkpoint folder>/zerowait"
        return f"<zerowait.lightning.CheckpointIO {where!r}>"


class _Publication(threading.Thread):
    """Waits for one save to commit, then writes its pointer file atomically; a pointer it
    replaces names a step nothing names any more, handed to the plugin to retire. Joined by the
    plugin before the next save, a load or removal of its path, and at teardown; it always ends,
    since every save does (committed or failed)."""

    def __init__(self, plugin: CheckpointIO, handle: Any, path: str, pointer: Dict[str, Any],
                 directory: str) -> None:
        super().__init__(name="zerowait-lightning-pointer")
        self._plugin = plugin
        self._handle = handle
        self._path = path
        self._pointer = pointer
        self._directory = directory
        self.error: Optional[BaseException] = None

    def wait_on_saving_thread(self) -> None:
        """Waits for the save from the thread that started it. The save's background copy is
        judged (no tensor changed while it ran) only by that thread or an optimizer step's hook,
        so this thread's wait alone would never end while that thread waits for it in join().
        Its error is this thread's to report, not raised here."""
        try:
            self._handle.wait()
        except BaseException:  # noqa: BLE001 - run() records the same error for the plugin
            pass

    def names(self, path: str) -> bool:
        return os.path.realpath(path) == os.path.realpath(self._path)

    def run(self) -> None:
        try:
            self._handle.wait()
            with self._plugin._lock:
                replaced = None
                if os.path.isfile(self._path) and not os.path.islink(self._path):
                    try:
                        replaced = _read_pointer(self._path)
                    except ValueError:
                        pass  # a file of another CheckpointIO: replaced, as torch.save would
                _write_atomically(self._path, json.dumps(self._pointer, indent=1) + "\n")
                if replaced is not None:
                    directory, step = _pointer_target(replaced, self._path)
                    if (directory, step) != (self._directory, self._pointer["step"]):
                        self._plugin._unnamed.append((directory, step, replaced["run_id"]))
        except BaseException as error:  # noqa: BLE001 - raised by the plugin's next call
            self.error = error


# --- pointer files -----------------------------------------------------------------------------


def _local_path(path: Any, what: str) -> str:
    text = os.fspath(path)
    if "://" in str(text):
        raise ValueError(f"zerowait.lightning.CheckpointIO keeps checkpoints on a local "
                         f"filesystem; {what} {text!r} is a URL")
    return os.path.abspath(text)


def _pointer_directory(directory: str, folder: str) -> str:
    """``directory`` as a pointer in ``folder`` records it: relative to the folder when it lies
    inside it (so the folder can be moved whole), else absolute (both real paths)."""
    relative = os.path.relpath(directory, folder)
    return directory if relative.startswith(os.pardir) else relative


def _pointer_target(pointer: Dict[str, Any], path: str) -> Tuple[str, int]:
    """(directory, step) a pointer names; a relative directory is relative to the pointer's
    real folder (``last.ckpt`` may be a link to it)."""
    folder = os.path.dirname(os.path.realpath(path))
    return os.path.realpath(os.path.join(folder, pointer["directory"])), pointer["step"]


def _read_pointer(path: str) -> Dict[str, Any]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"Checkpoint file not found: {path}")
    with open(path, "rb") as f:
        data = f.read(_MAX_POINTER_BYTES + 1)
    try:
        pointer = json.loads(data) if len(data) <= _MAX_POINTER_BYTES else None
    except ValueError:
        pointer = None
    if not isinstance(pointer, dict) or pointer.get("format") != POINTER_FORMAT:
        raise ValueError(f"{path} is not a checkpoint of zerowait.lightning.CheckpointIO (a "
                         f"file torch.save wrote loads with Lightning's own CheckpointIO)")
    if pointer.get("version", 0) > POINTER_VERSION:
        raise ValueError(f"{path} has version {pointer['version']} of the {POINTER_FORMAT} "
                         f"format; this zerowait reads up to version {POINTER_VERSION}: upgrade "
                         f"zerowait")
    if not isinstance(pointer.get("step"), int) or not isinstance(pointer.get("directory"), str):
        raise ValueError(f"{path}: a {POINTER_FORMAT} record without its step or directory")
    return pointer


def _write_atomically(path: str, text: str) -> None:
    """Writes ``path`` whole or not at all: a temporary file, fsync, rename, directory fsync."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temporary = path + ".tmp"  # not "*.ckpt": ModelCheckpoint never takes it for a checkpoint
    with open(temporary, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    _fsync_directory(folder)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _step_number(name: str) -> Optional[int]:
    """N for ``step-N`` and ``step-N.tmp`` (the engine's step folders), else None."""
    if not name.startswith("step-"):
        return None
    digits = name[len("step-"):].removesuffix(".tmp")
    return int(digits) if digits.isdigit() else None
