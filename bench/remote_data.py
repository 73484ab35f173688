"""bench/remote.py's data set: random samples written once as WebDataset tars, then in every
format the rows read, and uploaded to the bucket.
"""

import json
import random
import shutil
import tarfile
import time

import common
import remote_rows
from remote_procs import run_task
from remote_rows import log

# ---- the data set --------------------------------------------------------------------------------

def data_params(args):
    return {"samples": args.samples, "min_bytes": args.min_bytes, "max_bytes": args.max_bytes,
            "seed": args.seed, "shard_bytes": args.shard_mb * 1_000_000, "labels": 1000}


def write_tars(folder, params):
    """The WebDataset tar shards: sample KEY is KEY.bin (random bytes) + KEY.cls (the label in
    decimal); a shard is closed once it holds shard_bytes. Deterministic from the seed."""
    rng = random.Random(params["seed"])
    folder.mkdir(parents=True)
    shard, tar, size = 0, None, 0
    for i in range(params["samples"]):
        if tar is None:
            tar = tarfile.open(folder / f"shard-{shard:06d}.tar", "w", format=tarfile.USTAR_FORMAT)
        payload = rng.randbytes(rng.randint(params["min_bytes"], params["max_bytes"]))
        label = str(rng.randrange(params["labels"])).encode()
        for field, data in (("bin", payload), ("cls", label)):
            info = tarfile.TarInfo(f"s{i:08d}.{field}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, _BytesReader(data))
            size += 512 + (len(data) + 511) // 512 * 512
        if size >= params["shard_bytes"]:
            tar.close()
            shard, tar, size = shard + 1, None, 0
    if tar is not None:
        tar.close()


class _BytesReader:
    def __init__(self, data):
        self.view, self.pos = memoryview(data), 0

    def read(self, n=-1):
        end = len(self.view) if n < 0 else self.pos + n
        chunk = bytes(self.view[self.pos:end])
        self.pos += len(chunk)
        return chunk


class DataSet:
    """The formats on local disk under out/remote-N/, each remade when its stamp (the data
    parameters) differs or is missing."""

    def __init__(self, out, args):
        self.params = data_params(args)
        self.root = out / f"remote-{args.samples}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.tars_dir = self.root / "wds"
        self.zw_dir = self.root / "zw"
        self.notes = {}

    def tars(self):
        return common.regular_files(self.tars_dir)

    def make(self, fmt, writer):
        """Calls writer(folder) unless folder holds `fmt` made from these parameters."""
        folder = self.root / fmt
        stamp = self.root / f"{fmt}.params.json"
        if common.stamp_matches(folder, stamp, self.params):
            return True
        stamp.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        log(f"writing {fmt} into {folder}")
        start = time.perf_counter()
        if writer(folder) is False:
            return False
        stamp.write_text(json.dumps(self.params))
        log(f"  {fmt} written in {time.perf_counter() - start:.1f} s")
        return True

    def prepare(self, zerowait, pythons, wanted_formats):
        self.make("wds", lambda folder: write_tars(folder, self.params))
        shard = str(self.params["shard_bytes"])
        self.make("zw", lambda folder: common.run(
            [zerowait, "pack", *self.tars(), "-o", str(folder), "--shard-size", shard]))
        for fmt, venv, task in (("litdata", "peers", "write_litdata"),
                                ("mds", "streaming", "write_mds")):
            if fmt in wanted_formats and pythons.get(venv):
                self.make(fmt, lambda folder, t=task, v=venv: self.write_with(pythons[v], t,
                                                                              folder, fmt))

    def write_with(self, python, task, folder, fmt):
        spec = {"tars": self.tars(), "out": str(folder),
                "shard_bytes": self.params["shard_bytes"]}
        result, error = run_task(python, task, spec)
        if error:
            self.notes[fmt] = f"writing {fmt} failed: {error}"
            log(self.notes[fmt])
            return False
        return True

    def has(self, fmt):
        return common.stamp_matches(self.root / fmt, self.root / f"{fmt}.params.json",
                                    self.params)

    def payload_bytes(self):
        return sum(len(payload) for _, payload, _ in remote_rows.tar_samples(self.tars()))

    def size(self, fmt):
        return common.total_bytes(common.regular_files(self.root / fmt))


# ==== the run: prepare, start the server, measure at each latency, report =========================
