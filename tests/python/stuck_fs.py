"""A FUSE file system that gets stuck on command, like a hung NFS mount: it mirrors a directory
read-only, and while the file FLAG exists every read of a file whose name ends in STUCK_SUFFIX
blocks until FLAG is removed (or the file system is unmounted). Reads bypass the page cache
(direct_io), so each one reaches this process.

    python stuck_fs.py SOURCE MOUNTPOINT FLAG [STUCK_SUFFIX]

Runs in the foreground until unmounted or killed. Needs /dev/fuse, libfuse2 and fusepy.
"""

from __future__ import annotations

import errno
import os
import sys
import time

from fuse import FUSE, FuseOSError, Operations


class StuckOnCommand(Operations):
    def __init__(self, source: str, flag: str, suffix: str) -> None:
        self.source = source
        self.flag = flag
        self.suffix = suffix

    def _real(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._real(path))
        except OSError as e:
            raise FuseOSError(e.errno) from e
        keys = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime", "st_mtime",
                "st_ctime")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._real(path))

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        return os.open(self._real(path), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        while path.endswith(self.suffix) and os.path.exists(self.flag):
            time.sleep(0.05)
        return os.pread(fh, size, offset)

    def release(self, path, fh):
        os.close(fh)
        return 0


def main() -> None:
    source, mountpoint, flag = sys.argv[1:4]
    suffix = sys.argv[4] if len(sys.argv) > 4 else ""
    FUSE(StuckOnCommand(source, flag, suffix), mountpoint, foreground=True, nothreads=False,
         ro=True, direct_io=True)


if __name__ == "__main__":
    main()
