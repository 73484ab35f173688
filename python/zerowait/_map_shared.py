"""The files ``Loader(map=fn, map_mode="process")`` passes batches through, and where they live.

By default they live in /dev/shm (memory, no disk I/O). A container's /dev/shm is often small
(Docker's default is 64 MiB), and a tmpfs that is full turns a write into a mapped page into
SIGBUS ("Bus error"), killing the process. So every file is grown with posix_fallocate: a full
folder is an ENOSPC at grow time, never a crash. Then the stage moves what does not fit to a
folder under $TMPDIR (disk-backed, still served from the page cache), says so once and counts it
in ``stats()["map"]``; with ``map_dir=`` it uses that folder only and a full one is an error
naming the fix (see ``no_space_message``).
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

# Status file: word 0 is the cancel watermark (batches with an id at or below it are dropped);
# worker w writes the batch id and the row it is running into words 1 + 2w and 2 + 2w.
WORD = 8
SHM = "/dev/shm"
_MIB = 1 << 20


class SharedFile:
    """A file in one of the stage's folders, mapped read-write; grow() enlarges it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.map: Optional[mmap.mmap] = None
        self.size = 0
        self.remap()

    def remap(self) -> None:
        size = os.fstat(self.fd).st_size
        if size != self.size or self.map is None:
            if self.map is not None:
                try:
                    self.map.close()
                except BufferError:  # fn kept a view of a sample: the old mapping lives on
                    pass
            self.map = mmap.mmap(self.fd, size) if size else None
            self.size = size

    def grow(self, nbytes: int) -> None:
        """At least ``nbytes``, the space reserved: OSError(ENOSPC) when the folder is full,
        where ftruncate would leave a sparse file whose first write past the free space raises
        SIGBUS."""
        if nbytes > self.size:
            os.posix_fallocate(self.fd, 0, max(nbytes, self.size * 3 // 2, _MIB))
            self.remap()

    def buffer(self) -> Any:
        return self.map if self.map is not None else bytearray()

    def close(self) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a view still points in; the mapping goes with the process
                pass
        os.close(self.fd)


class Status:
    """The status words (see WORD above), shared by the parent and every worker."""

    def __init__(self, path: str, workers: int, create: bool) -> None:
        self.file = SharedFile(path)
        if create:
            self.file.grow(max(WORD * (1 + 2 * workers), 1))
        self.words = np.frombuffer(self.file.buffer(), np.int64, 1 + 2 * workers)

    def running(self, worker: int) -> Tuple[int, int]:
        return int(self.words[1 + 2 * worker]), int(self.words[2 + 2 * worker])


def _free_text(folder: str) -> str:
    try:
        st = os.statvfs(folder)
    except OSError:
        return "free space unknown"
    return (f"{st.f_bavail * st.f_frsize / _MIB:.1f} MiB free of "
            f"{st.f_blocks * st.f_frsize / _MIB:.1f} MiB")


class Folders:
    """Where the stage's files go: a folder made in ``map_dir``, else in /dev/shm (else $TMPDIR
    where there is no /dev/shm), and a fallback folder in $TMPDIR made the first time /dev/shm
    is full. ``folders`` lists every folder made, for the cleanup; ``current`` is where new
    files go."""

    def __init__(self, map_dir: Optional[str]) -> None:
        self.explicit = map_dir is not None
        if self.explicit:
            base = os.fspath(map_dir)
        else:
            base = SHM if os.path.isdir(SHM) else tempfile.gettempdir()
        try:
            self.primary = tempfile.mkdtemp(prefix="zerowait-map-", dir=base)
        except OSError as e:
            raise OSError(e.errno, f"cannot make the map stage's folder in {base}: "
                                   f"{e.strerror} (map_dir= or $TMPDIR chooses another)") from e
        self.base = base
        self.fallback: Optional[str] = None
        self.folders: List[str] = [self.primary]
        self.fallbacks = 0  # files placed in the fallback folder because the first was full

    @property
    def current(self) -> str:
        return self.fallback or self.primary

    def can_fall_back(self) -> bool:
        """Whether a full folder may be left for $TMPDIR: /dev/shm chosen by default, and not
        left already."""
        return not self.explicit and self.fallback is None and self.base == SHM

    def fall_back(self, nbytes: int) -> str:
        """Makes the fallback folder and says so, once."""
        before = f"{self.base} ({_free_text(self.base)})"
        self.fallback = tempfile.mkdtemp(prefix="zerowait-map-", dir=tempfile.gettempdir())
        self.folders.append(self.fallback)
        warnings.warn(f"zerowait map stage: {before} cannot hold {nbytes / _MIB:.1f} MiB more; "
                      f"batches now pass through {self.fallback} (on $TMPDIR's filesystem, "
                      f"slower than memory). Fix: docker run --shm-size=8g (Kubernetes: an "
                      f"emptyDir with medium: Memory at /dev/shm), or Loader(map_dir=...) to "
                      f"choose the folder", RuntimeWarning, stacklevel=6)
        return self.fallback

    def no_space_message(self, folder: str, nbytes: int, error: OSError) -> str:
        """The error for a folder that cannot hold ``nbytes`` more and may not be left."""
        return (f"the map stage's folder {folder} cannot hold {nbytes / _MIB:.1f} MiB more "
                f"({_free_text(folder)}; {error.strerror}): each map worker holds up to "
                f"map_prefetch batches of samples and of fn's results there. Fix: a larger "
                f"/dev/shm (docker run --shm-size=8g; Kubernetes: an emptyDir with medium: "
                f"Memory at /dev/shm), Loader(map_dir=DIR) on a local disk with room, or fewer "
                f"map_workers, a smaller map_prefetch or smaller batches")

    def remove(self) -> None:
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)


class NoSpace(Exception):
    """No folder the stage may use has room; the message names the fix."""


class Slots:
    """The parent's batch slots: a file each for a batch's samples (``slot``) and for fn's
    results (``slot + ".out"``), named "slotN" in the first folder or by their path in the
    fallback one (workers open both the same way: os.path.join(first folder, name)). Released
    slots are reused while they lie in the current folder."""

    def __init__(self, shared_dir: Optional[str]) -> None:
        self.folders = Folders(shared_dir)
        self.folder = self.folders.primary
        self.files: Dict[str, SharedFile] = {}
        self.free: List[str] = []
        self.made = 0

    def shared(self, name: str) -> SharedFile:
        if name not in self.files:
            self.files[name] = SharedFile(os.path.join(self.folder, name))
        return self.files[name]

    def discard(self, slot: str) -> None:
        """Removes a slot's files (a worker's mapping keeps its pages until it exits)."""
        for name in (slot, slot + ".out"):
            shared = self.files.pop(name, None)
            if shared is not None:
                shared.close()
            try:
                os.unlink(os.path.join(self.folder, name))
            except FileNotFoundError:
                pass

    def release(self, slot: str) -> None:
        if os.path.dirname(os.path.join(self.folder, slot)) == self.folders.current:
            self.free.append(slot)
        else:  # left behind in a full /dev/shm
            self.discard(slot)

    def in_current_folder(self, slot: str) -> bool:
        return os.path.dirname(os.path.join(self.folder, slot)) == self.folders.current

    def leave_full_folder(self, nbytes: int) -> None:
        """Moves on to the fallback folder (NoSpace where that is not allowed)."""
        if not self.folders.can_fall_back():
            raise NoSpace(self.folders.no_space_message(
                self.folders.current, nbytes, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
        self.folders.fall_back(nbytes)
        for free in self.free:
            self.discard(free)
        self.free.clear()

    def place(self, nbytes: int, copy_from: Optional[str] = None) -> str:
        """A slot with room for ``nbytes`` (holding ``copy_from``'s first ``nbytes`` when
        given): in the current folder, else, the first time /dev/shm is full, in the fallback
        folder. NoSpace naming the fix when no folder has room."""
        while True:
            self.made += not self.free
            slot = self.free.pop() if self.free else self._name(self.made)
            target = self.shared(slot)
            try:
                target.grow(nbytes)
                break
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                self.discard(slot)
                if not self.folders.can_fall_back():
                    raise NoSpace(self.folders.no_space_message(self.folders.current, nbytes,
                                                                e)) from None
                self.leave_full_folder(nbytes)
        if self.folders.fallback is not None:
            self.folders.fallbacks += 1
        if copy_from is not None:
            source = self.shared(copy_from)
            source.remap()
            np.frombuffer(target.buffer(), np.uint8, nbytes)[:] = np.frombuffer(
                source.buffer(), np.uint8, nbytes)
        return slot

    def _name(self, number: int) -> str:
        name = f"slot{number}"
        return name if self.folders.fallback is None else os.path.join(self.folders.fallback, name)

    def close(self) -> None:
        for shared in self.files.values():
            shared.close()
        self.files.clear()
