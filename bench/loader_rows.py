"""The rows of the loader benchmark (bench/loader.py, whose docstring says what each measures
and why the comparison is fair): one function per row, and ROWS, the table from the letters
`--rows` takes to those functions.

Every row but (e) runs in a fresh process of the rows' interpreter, so that none inherits
another's memory, threads or imports: `python loader_rows.py ROW SPEC_JSON` runs row ROW with
the spec loader.py builds (paths, batch size, memory budget, cache method...) and prints its
result as one JSON line on stdout; progress goes to stderr. torch, torchvision and zerowait are
imported inside the rows, so loader.py imports this module with the standard library alone.
"""

import functools
import json
import os
import sys
import time

import common

REF_WARMUP_BATCHES = 2

log = functools.partial(common.log, tag="loader-bench")


def proc_status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def capped_dataloader_run(loader, spec, count):
    """Iterates `loader`: REF_WARMUP_BATCHES untimed, then up to spec['cap'] timed batches.
    `count(batch)` returns (samples, bytes)."""
    it = iter(loader)
    total = len(loader)
    warmup = min(REF_WARMUP_BATCHES, max(total - 1, 0))
    for _ in range(warmup):
        next(it)
    timed = min(spec["cap"], total - warmup)
    samples = nbytes = 0
    start = time.perf_counter()
    for _ in range(timed):
        s, b = count(next(it))
        samples += s
        nbytes += b
    seconds = time.perf_counter() - start
    del it  # shuts the workers down (not timed)
    return {"seconds": seconds, "samples": samples, "bytes": nbytes, "batches": timed,
            "epoch_batches": total, "warmup_batches": warmup}


def row_dataloader_per_file(spec):
    """(a) PyTorch DataLoader over a per-file Dataset returning raw bytes."""
    import torch
    from torch.utils.data import DataLoader, Dataset, get_worker_info

    class FilesDataset(Dataset):
        def __init__(self, root):
            classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
            self.samples = [(os.path.join(root, c, name), label)
                            for label, c in enumerate(classes)
                            for name in sorted(os.listdir(os.path.join(root, c)))]

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            path, label = self.samples[i]
            with open(path, "rb", buffering=0) as f:
                buf = bytearray(os.fstat(f.fileno()).st_size)
                n = f.readinto(buf)
            if n != len(buf):
                del buf[n:]
            if not buf:
                return torch.empty(0, dtype=torch.uint8), label
            return torch.frombuffer(buf, dtype=torch.uint8), label

    def collate_list(items):
        # What a user writes for variable-sized samples: the batch as a list of tensors. Each
        # crosses from the worker as its own shared-memory tensor.
        return {"jpg": [t for t, _ in items],
                "cls": torch.tensor([label for _, label in items], dtype=torch.int64)}

    def collate_flat(items):
        tensors = [t for t, _ in items]
        sizes = [t.numel() for t in tensors]
        out = None
        if get_worker_info() is not None:
            # As default_collate does: write the batch straight into shared memory, so it
            # crosses to the main process as one tensor.
            storage = tensors[0]._typed_storage()._new_shared(sum(sizes), device="cpu")
            out = tensors[0].new(storage).resize_(sum(sizes))
        flat = torch.cat(tensors, out=out)
        offsets = torch.zeros(len(sizes) + 1, dtype=torch.int64)
        torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0, out=offsets[1:])
        return {"jpg": flat, "jpg.offsets": offsets,
                "cls": torch.tensor([label for _, label in items], dtype=torch.int64)}

    def count(batch):
        jpg = batch["jpg"]
        return batch["cls"].numel(), (sum(t.numel() for t in jpg) if isinstance(jpg, list)
                                      else jpg.numel())

    dataset = FilesDataset(spec["tree"])
    loader = DataLoader(dataset, batch_size=spec["batch_size"], shuffle=True, num_workers=2,
                        collate_fn=collate_flat if spec.get("collate") == "flat" else collate_list,
                        generator=torch.Generator().manual_seed(0))
    return capped_dataloader_run(loader, spec, count)


def row_torchvision_decode(spec):
    """(c) torchvision ImageFolder + RandomResizedCrop + flip, uint8."""
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.RandomResizedCrop(224),
                                    transforms.RandomHorizontalFlip(),
                                    transforms.PILToTensor()])
    dataset = datasets.ImageFolder(spec["tree"], transform=transform)
    loader = DataLoader(dataset, batch_size=spec["batch_size"], shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(0))

    def count(batch):
        images, labels = batch
        assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, 224, 224)
        return labels.numel(), 0  # decoded rows are judged on samples/s

    result = capped_dataloader_run(loader, spec, count)
    result["versions"] = {"torch": torch.__version__,
                          "torchvision": __import__("torchvision").__version__}
    return result


def import_zerowait():
    import torch  # noqa: F401  (the baseline RSS includes torch, as a training script's does)
    import zerowait
    if not hasattr(zerowait, "Loader"):
        raise LookupError(f"zerowait.Loader is not in {os.path.dirname(zerowait.__file__)} "
                          "(pip install --no-build-isolation . once it has landed)")
    return zerowait


# (b) and (d) use as many worker threads as their references (a) and (c) use DataLoader worker
# processes; (f) keeps the loader's default (one per CPU but one, the rest left to the consumer).
REFERENCE_WORKERS = 2


def zerowait_loader(zerowait, spec, **overrides):
    kwargs = {"batch_size": spec["batch_size"], "shuffle": "random", "seed": 0,
              "memory_budget": spec["memory_budget"]}
    kwargs.update(overrides)
    return zerowait.Loader(spec["shards"], **kwargs)


def raw_counts(batch):
    samples = batch["__index__"].numel()
    nbytes = sum(v.numel() * v.element_size() for k, v in batch.items()
                 if not k.endswith(".offsets") and k + ".offsets" in batch)
    return samples, nbytes


STATS_COUNTERS = {"batches", "samples", "bytes_read", "skipped", "padded", "io_fallbacks"}


def stats_delta(after, before):
    """stats() over one epoch: counters (and times, *_s) as differences, settings and pool state
    (threads, arenas, ...) as they stand at the end; lists left out."""
    delta = {}
    for key, value in after.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        counter = key in STATS_COUNTERS or key.endswith("_s")
        delta[key] = value - before.get(key, 0) if counter else value
    return delta


def zerowait_epoch(loader, epoch, label, count=raw_counts, consume=None):
    """One full epoch; returns seconds (from iter() to the last batch handled), samples, bytes,
    batches, the consumer's compute time, stats() over the epoch, and the consumer's own
    measure of its waits (first batch, the rest, the longest)."""
    loader.set_epoch(epoch)
    before = dict(loader.stats())
    log(f"  {label}: epoch {epoch}, {len(loader)} batches")
    samples = nbytes = batches = 0
    compute = 0.0
    waits = []
    start = ready = time.perf_counter()
    for batch in loader:
        waits.append(time.perf_counter() - ready)
        s, b = count(batch)
        samples += s
        nbytes += b
        batches += 1
        if consume is not None:
            compute += consume()
        ready = time.perf_counter()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "samples": samples, "bytes": nbytes, "batches": batches,
            "epoch_batches": len(loader), "compute_s": compute,
            "stats": stats_delta(dict(loader.stats()), before),
            "waits": {"first_s": waits[0] if waits else 0.0, "rest_s": sum(waits[1:]),
                      "max_rest_s": max(waits[1:], default=0.0),
                      "rest_over_1ms": sum(w > 1e-3 for w in waits[1:])}}


def row_zerowait_raw(spec):
    """(b) zerowait raw bytes: warm-up epoch, warm epoch, cold epoch; baseline and peak RSS."""
    zerowait = import_zerowait()
    baseline_kib = proc_status_kib("VmRSS")
    loader = zerowait_loader(zerowait, spec, threads=REFERENCE_WORKERS)
    try:
        warmup = zerowait_epoch(loader, 0, "warm-up")
        warm = zerowait_epoch(loader, 1, "warm")
        log(f"  dropping caches ({spec['cold_method']})")
        common.drop_page_cache(spec["cold_method"], spec["shard_files"])
        cold = zerowait_epoch(loader, 2, "cold")
    finally:
        loader.close()
    return {"warmup": warmup, "warm": warm, "cold": cold,
            "baseline_rss": baseline_kib * 1024, "peak_rss": proc_status_kib("VmHWM") * 1024}


def row_zerowait_block(spec):
    """(g) zerowait raw bytes, shuffle="block", io="direct", cold: one epoch after the caches
    are dropped, each block (2 MiB by default) read whole with O_DIRECT, as fio's O_DIRECT row
    reads; the order still shuffles samples within windows of blocks."""
    zerowait = import_zerowait()
    loader = zerowait_loader(zerowait, spec, threads=REFERENCE_WORKERS, shuffle="block",
                             io="direct")
    try:
        log(f"  dropping caches ({spec['cold_method']})")
        common.drop_page_cache(spec["cold_method"], spec["shard_files"])
        cold = zerowait_epoch(loader, 0, "cold")
    finally:
        loader.close()
    return {"cold": cold}


def row_zerowait_decode(spec):
    """(d) zerowait decode: RandomResizedCrop(224, flip=True) and cls as int, warm."""
    zerowait = import_zerowait()
    import torch
    decode = {"jpg": zerowait.RandomResizedCrop(224, flip=True), "cls": "int"}
    loader = zerowait_loader(zerowait, spec, decode=decode, threads=REFERENCE_WORKERS)

    def count(batch):
        images, labels = batch["jpg"], batch["cls"]
        assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (224, 224, 3), \
            f"decoded jpg is {images.dtype} {tuple(images.shape)}"
        assert labels.dtype == torch.int64, f"decoded cls is {labels.dtype}"
        return labels.numel(), 0  # decoded rows are judged on samples/s

    try:
        warmup = zerowait_epoch(loader, 0, "warm-up", count)
        warm = zerowait_epoch(loader, 1, "warm", count)
    finally:
        loader.close()
    return {"warmup": warmup, "warm": warm, "peak_rss": proc_status_kib("VmHWM") * 1024}


def compute_for(seconds):
    """Emulated accelerator work: sleeps, then spins the last 0.2 ms. Returns the time spent."""
    start = time.perf_counter()
    end = start + seconds
    if seconds > 0.0004:
        time.sleep(seconds - 0.0002)
    while time.perf_counter() < end:
        pass
    return time.perf_counter() - start


def row_emulated_accelerator(spec):
    """(f) emulated accelerator: t_b from a no-op epoch, then 1.5 x t_b of compute per batch."""
    zerowait = import_zerowait()
    loader = zerowait_loader(zerowait, spec)
    try:
        zerowait_epoch(loader, 0, "warm-up")
        idle = zerowait_epoch(loader, 1, "t_b (consumer does nothing)")
        t_b = idle["seconds"] / max(idle["batches"], 1)
        per_batch = spec["compute_factor"] * t_b
        log(f"  t_b = {t_b * 1e3:.2f} ms; consumer computes {per_batch * 1e3:.2f} ms per batch")
        busy = zerowait_epoch(loader, 2, "emulated accelerator",
                              consume=lambda: compute_for(per_batch))
    finally:
        loader.close()
    return {"t_b": t_b, "compute_per_batch": per_batch, "idle": idle, "busy": busy,
            "utilisation": busy["compute_s"] / busy["seconds"]}


def row_fio(spec):
    """(e) fio over the shard files, cold, buffered then O_DIRECT: {"buffered": {"seconds",
    "bytes"}, "direct": {...}}. Unlike the other rows it runs in the parent (fio is a process of
    its own), which drops the caches with the same method the rows use."""
    result = {}
    for mode, direct in (("buffered", False), ("direct", True)):
        log(f"  fio {mode}: dropping caches ({spec['cold_method']})")
        common.drop_page_cache(spec["cold_method"], spec["shard_files"])
        seconds, nbytes = common.fio_seq_read(spec["shard_files"], direct)
        result[mode] = {"seconds": seconds, "bytes": nbytes}
    return result


# The rows by the letters --rows takes (the short names users type): what each measures, as
# --help says it, and the function that measures it.
ROWS = {
    "a": ("DataLoader per-file raw", row_dataloader_per_file),
    "b": ("zerowait raw (warm, cold, RSS)", row_zerowait_raw),
    "c": ("torchvision decode+crop", row_torchvision_decode),
    "d": ("zerowait decode+crop", row_zerowait_decode),
    "e": ("fio", row_fio),
    "f": ("emulated accelerator", row_emulated_accelerator),
    "g": ("zerowait raw, shuffle=block, O_DIRECT, cold", row_zerowait_block),
}


def main(argv):
    if len(argv) != 3 or argv[1] not in ROWS:
        sys.exit(f"usage: {argv[0]} ROW SPEC_JSON, ROW one of {','.join(ROWS)} "
                 "(bench/loader.py runs it)")
    spec = json.loads(argv[2])
    try:
        result = ROWS[argv[1]][1](spec)
    except LookupError as error:  # zerowait.Loader missing: a skip, not a failure
        if "zerowait.Loader" not in str(error):
            raise
        result = {"skipped": str(error)}
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))


