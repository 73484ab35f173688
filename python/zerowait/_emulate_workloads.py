"""The workloads of ``zerowait emulate``: MLPerf Storage's presets, what ``--scale`` makes of
them, the data set ``--generate`` writes, and page-cache eviction.

Numbers come from MLPerf Storage's DLIO configurations (github.com/mlcommons/storage,
``configs/dlio/workload/{unet3d,resnet50,cosmoflow}_{h100,a100}.yaml``): record_length_bytes
(and its stdev), num_samples_per_file, batch_size, computation_time, read_threads and
metric.au. The checkpoint sizes and rank counts are MLPerf Storage v2.0's checkpointing
workloads (llama3-8b: 105 GB from 8 processes; llama3-70b: 912 GB from 64).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import _core

SOURCE = "github.com/mlcommons/storage configs/dlio/workload"
# MLPerf Storage's data-size rule (its README, "Data Sizing"): the data set is at least 5x the
# clients' memory, and at least 500 steps of a batch.
MEMORY_MULTIPLE = 5
MIN_STEPS = 500
METADATA = "emulate.json"  # what --generate made, beside DIR/zerowait and DIR/files
FIELD = "bin"  # the one field of every generated sample


@dataclass(frozen=True)
class Training:
    name: str
    sample_bytes: float  # mean record_length_bytes
    sample_stdev: float
    samples_per_file: int
    batch: int
    compute: Dict[str, float]  # computation_time per batch, by accelerator
    floor: float  # metric.au
    read_threads: int
    config: str  # the DLIO configuration the numbers come from


@dataclass(frozen=True)
class Checkpointing:
    name: str
    total_bytes: int  # the whole checkpoint, over every rank
    ranks: int
    config: str


TRAINING = {
    "unet3d": Training("unet3d", 146_600_628, 68_341_808, 1, 7,
                       {"h100": 0.323, "a100": 0.636}, 0.90, 4, "unet3d_{acc}.yaml"),
    "resnet50": Training("resnet50", 114_660, 0, 1251, 400,
                         {"h100": 0.224, "a100": 0.435}, 0.90, 8, "resnet50_{acc}.yaml"),
    "cosmoflow": Training("cosmoflow", 2_828_486, 71_311, 1, 1,
                          {"h100": 0.00350, "a100": 0.00551}, 0.70, 4, "cosmoflow_{acc}.yaml"),
}
CHECKPOINTING = {
    "llama3-8b": Checkpointing("llama3-8b", 105 * 10**9, 8, "llama3_8b.yaml"),
    "llama3-70b": Checkpointing("llama3-70b", 912 * 10**9, 64, "llama3_70b.yaml"),
}
WORKLOADS = list(TRAINING) + list(CHECKPOINTING)
ACCELERATORS = ("h100", "a100")


def memory_bytes() -> int:
    """This host's memory (MemTotal), the base of MLPerf's data-size rule."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def full_samples(preset: Training) -> int:
    """The samples of the unscaled data set on this host: MLPerf's rule, in whole files."""
    samples = max(math.ceil(MEMORY_MULTIPLE * memory_bytes() / preset.sample_bytes),
                  MIN_STEPS * preset.batch)
    return math.ceil(samples / preset.samples_per_file) * preset.samples_per_file


def scaled_training(preset: Training, scale: float, samples: Optional[int] = None) -> Dict:
    """What ``scale`` makes of the data set's numbers (compute is scaled in :func:`plan`):
    sample sizes and the sample count both shrink by ``scale`` (the bytes by scale**2);
    ``samples`` replaces the scaled count."""
    count = samples if samples is not None else max(
        preset.batch, round(full_samples(preset) * scale))
    per_file = min(preset.samples_per_file, count)
    return dict(
        workload=preset.name, scale=scale, samples=count, samples_given=samples is not None,
        samples_per_file=per_file,
        files=math.ceil(count / per_file),
        sample_bytes=max(1, round(preset.sample_bytes * scale)),
        sample_stdev=round(preset.sample_stdev * scale))


def plan(preset: Training, accelerator: str, scale: float,
         compute: Optional[float] = None) -> Dict:
    """The per-run numbers: batch, compute per batch (scaled like the sample sizes, so each
    emulated accelerator asks for the same bytes per second as the full workload, unless
    ``compute`` gives it in seconds), AU floor."""
    return dict(batch=preset.batch, floor=preset.floor,
                compute=compute if compute is not None else preset.compute[accelerator] * scale,
                compute_full=preset.compute[accelerator], compute_given=compute is not None,
                config=f"{SOURCE}/{preset.config.format(acc=accelerator)}")


def describe_scaling(preset: Training, data: Dict, run: Dict) -> List[str]:
    """One line per number that the scale changed: 'what MLPerf says -> what this run uses'."""
    scale = data["scale"]
    size = f"{preset.sample_bytes:,.0f}" + (
        f" ± {preset.sample_stdev:,.0f}" if preset.sample_stdev else "")
    scaled = f"{data['sample_bytes']:,}" + (
        f" ± {data['sample_stdev']:,}" if data["sample_stdev"] else "")
    full = full_samples(preset)
    compute_note = "given by --compute" if run["compute_given"] else f"x {scale:g}"
    return [
        f"sample bytes   {size} -> {scaled} (x {scale:g})",
        f"samples        {full:,} (5 x this host's memory, or 500 batches) -> "
        f"{data['samples']:,}" + (" (--samples)" if data.get("samples_given") else ""),
        f"samples/file   {preset.samples_per_file:,} -> {data['samples_per_file']:,}",
        f"batch          {preset.batch} (unchanged)",
        f"compute/batch  {run['compute_full']:.5g} s -> {run['compute']:.5g} s ({compute_note})",
        f"AU floor       {preset.floor:.0%} (unchanged)",
    ]


def sample_sizes(data: Dict, seed: int) -> np.ndarray:
    """Every sample's size, drawn from a normal distribution with the preset's (scaled) mean
    and stdev, cut at 3 stdev either side and at 1 byte; fixed when the stdev is 0."""
    mean, stdev, count = data["sample_bytes"], data["sample_stdev"], data["samples"]
    if stdev == 0 or data["samples_per_file"] > 1:  # records of a file are fixed-size
        return np.full(count, mean, dtype=np.int64)
    rng = np.random.default_rng([seed, 1])
    sizes = rng.normal(mean, stdev, count).clip(max(1, mean - 3 * stdev), mean + 3 * stdev)
    return sizes.round().astype(np.int64)


def format_bytes(n: float) -> str:
    """Decimal units, as storage vendors and MLPerf quote them."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.{3 if unit == 'GB' else 1}f} {unit}"
    return f"{n:,.0f} B"


def file_name(index: int) -> str:
    return f"{index:07d}.bin"


def generate(out: str, data: Dict, seed: int, log) -> Dict:
    """Writes the data set twice under ``out``: ``zerowait/`` (shards, through ShardWriter) and
    ``files/`` (plain files; several samples per file as fixed-size records back to back), the
    same random bytes in both, then ``emulate.json``. Both are fsynced, so that eviction can
    drop them from the page cache."""
    from zerowait.writer import ShardWriter

    os.makedirs(out, exist_ok=True)
    files_dir = os.path.join(out, "files")
    os.makedirs(files_dir, exist_ok=True)
    for name in os.listdir(files_dir):  # an earlier generation's files
        if name.endswith(".bin"):
            os.unlink(os.path.join(files_dir, name))
    sizes = sample_sizes(data, seed)
    rng = np.random.default_rng([seed, 2])
    per_file = data["samples_per_file"]
    total = 0
    with ShardWriter(os.path.join(out, "zerowait"), overwrite=True) as writer:
        for first in range(0, data["samples"], per_file):
            count = min(per_file, data["samples"] - first)
            path = os.path.join(files_dir, file_name(first // per_file))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for index in range(first, first + count):
                    payload = rng.bytes(int(sizes[index]))
                    writer.write({"__key__": f"{index:09d}", FIELD: payload})
                    _write_all(fd, payload, path)
                    total += len(payload)
                os.fsync(fd)
            finally:
                os.close(fd)
            done = first // per_file + 1
            if done % max(100, data["files"] // 5) == 0 and done < data["files"]:
                log(f"generated {first + count:,} of {data['samples']:,} samples")
    metadata = dict(data, seed=seed, bytes=total)
    with open(os.path.join(out, METADATA), "w") as f:
        json.dump(metadata, f, indent=1)
        f.write("\n")
    return metadata


def _write_all(fd: int, payload: bytes, path: str) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


def load_metadata(data_dir: str, workload: str) -> Dict:
    """emulate.json of a generated data set; ValueError when it is missing or for another
    workload."""
    path = os.path.join(data_dir, METADATA)
    try:
        with open(path) as f:
            metadata = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{data_dir} holds no data set made by zerowait emulate ({path} is "
                         f"missing); make one with: zerowait emulate {workload} --generate "
                         f"{data_dir}") from None
    if metadata.get("workload") != workload:
        raise ValueError(f"{data_dir} holds a {metadata.get('workload')} data set, not "
                         f"{workload}; generate one with --generate")
    return metadata


def data_files(data_dir: str, which: str) -> List[str]:
    """The files of the ``zerowait`` or ``files`` copy of a data set, sorted."""
    root = os.path.join(data_dir, which)
    out = []
    for parent, _, names in os.walk(root):
        out.extend(os.path.join(parent, n) for n in names)
    return sorted(out)


def evict(paths: List[str]) -> Tuple[int, int]:
    """Drops the files' pages from the page cache (fdatasync, then posix_fadvise
    POSIX_FADV_DONTNEED, as `zerowait bench files` does). Returns (files, bytes)."""
    _core.evict_from_page_cache(list(paths))
    return len(paths), sum(os.stat(path).st_size for path in paths)


# A run is labelled by what the page cache held of its files when it began, measured (mincore),
# not by what was asked: tmpfs keeps a file's pages whatever eviction asks, so a "cold" run there
# is warm. At most 1 % resident counts as evicted, at least 99 % as warm.
EVICTED_AT_MOST = 0.01
WARM_AT_LEAST = 0.99


def measure_page_cache(paths: List[str]) -> Dict:
    """What the page cache holds of ``paths`` now: {"resident_share" (None when this user cannot
    measure them), "label": "evicted" / "partial" / "warm" / "unknown", "text"}, the text as
    printed ("evicted (0.0 % resident)")."""
    measured = _core.page_cache_residency(list(paths))
    known = measured["bytes"] - measured["unmeasured_bytes"]
    if known <= 0 and measured["bytes"] > 0:
        return dict(resident_share=None, label="unknown",
                    text=f"unknown ({measured['unmeasured_reason']})")
    share = measured["resident_bytes"] / known if known > 0 else 1.0
    label = ("evicted" if share <= EVICTED_AT_MOST
             else "warm" if share >= WARM_AT_LEAST else "partial")
    return dict(resident_share=round(share, 4), label=label,
                text=f"{label} ({share * 100:.1f} % resident)")
