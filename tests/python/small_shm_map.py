"""A Loader(map=fn, map_mode="process") run by test_map_small_shm.py inside a private mount
namespace whose /dev/shm is a 64 MiB tmpfs, over batches larger than that. Prints one JSON line:
what fn returned per sample (a checksum), the error if any, the warnings, stats()["map"], and
what the stage left in /dev/shm."""

import json
import os
import sys
import warnings
import zlib

import numpy as np

import zerowait


def reverse(sample):
    """Results as large as the samples: the bytes, reversed (so fn provably ran)."""
    return {"out": np.ascontiguousarray(sample["blob"][::-1])}


def main() -> None:
    dataset, map_dir = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
    shm = os.statvfs("/dev/shm")
    seen, error = {}, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = zerowait.Loader(dataset, 8, seed=1, map=reverse, map_workers=2, map_prefetch=2,
                                 output="numpy", map_dir=map_dir)
        try:
            for batch in loader:
                for row, index in enumerate(batch["__index__"].tolist()):
                    seen[index] = zlib.crc32(batch["out"][row].tobytes())
        except zerowait.MapError as e:
            error = str(e)
        stats = loader.stats()["map"]
        loader.close()
    print(json.dumps(dict(
        shm_bytes=shm.f_blocks * shm.f_frsize, seen=seen, error=error,
        warnings=[str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
        shared_dir=stats["shared_dir"], shared_fallbacks=stats["shared_fallbacks"],
        shm_left=os.listdir("/dev/shm"))))


if __name__ == "__main__":
    main()
