"""Per-sample Python benchmark: a torchvision v2 augmentation pipeline through
zerowait.Loader(map=fn) in worker processes against the PyTorch DataLoader(num_workers=2), over
the same JPEGs, 2 CPUs each.

The pipeline: decode, RandomResizedCrop(224), ColorJitter(0.4, 0.4, 0.4, 0.1), RandAugment(),
PILToTensor, the label beside it. Rows, each timed over epochs after a warm-up epoch (page cache
warm, workers started):

- DataLoader: the JPEG files, a torch Dataset that opens each with Pillow and applies the
  pipeline, DataLoader(batch_size, shuffle=True, num_workers=2, persistent_workers=True);
- zerowait map, whole pipeline: the same files packed into shards, zerowait.Loader(map=fn,
  map_workers=2) where fn decodes the sample's bytes with Pillow and applies the same pipeline;
- zerowait decode + map: the loader decodes and crops natively
  (decode={"jpg": RandomResizedCrop(224)}, C++ threads, scaled-down JPEG decoding) and fn applies
  the rest, ColorJitter + RandAugment, to the 224x224 image with the same torchvision calls.

Memory per worker is read from /proc/PID/smaps_rollup after the timed epochs: RSS, and "unique",
the pages no other process shares (what a worker costs beyond the forked training process).

Goal (issue 11): zerowait >= 1.5x the DataLoader's samples/s. The bound printed beside it: the
native row's samples each need zerowait's decode + crop (timed alone, 2 threads) and fn (timed
alone over ready crops, 2 processes) on the same 2 CPUs, so no map stage, however cheap, gets
past 1 / (1 / decode rate + 1 / fn rate).

Usage: bench/run map [--files 1500] [--batch-size 64] [--seconds 4] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import torch

import zerowait
from PIL import Image
from zerowait.map_stage import process_memory

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

torchvision = common.import_torchvision()
if torchvision is None:
    sys.exit("bench/run map needs torchvision (scripts/setup.sh installs it into .venv)")
from torchvision.transforms import v2  # noqa: E402

FULL = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.ColorJitter(0.4, 0.4, 0.4, 0.1),
                   v2.RandAugment(), v2.PILToTensor()])
AFTER_CROP = v2.Compose([v2.ColorJitter(0.4, 0.4, 0.4, 0.1), v2.RandAugment(), v2.PILToTensor()])


class Files(torch.utils.data.Dataset):
    def __init__(self, paths, labels):
        self.paths, self.labels = paths, labels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as image:
            return FULL(image.convert("RGB")), self.labels[i]


def whole_pipeline(sample):
    """fn for the first zerowait row: Pillow decodes the raw JPEG bytes (a shared-memory view)."""
    with Image.open(io.BytesIO(sample["jpg"])) as image:
        return {"img": FULL(image.convert("RGB")), "cls": sample["cls"]}


def after_native_crop(sample):
    """fn for the second: the loader already decoded and cropped (uint8 [224, 224, 3])."""
    return {"img": AFTER_CROP(Image.fromarray(sample["jpg"].numpy())), "cls": sample["cls"]}


def memory(pids):
    """(RSS, unique bytes) of each process, as the map stage reports its own workers."""
    return [(m["rss"], m["unique"]) for m in map(process_memory, pids)]


def decode_alone(shards, batch_size, seconds):
    """zerowait's decode + crop with no map stage, 2 threads: samples/s, and some of its crops."""
    with zerowait.Loader(shards, batch_size, threads=2,
                         decode={"jpg": zerowait.RandomResizedCrop(224), "cls": "int"}) as loader:
        rate, _ = common.timed_epochs(lambda: sum(len(b["cls"]) for b in loader), seconds)
        crops = []
        for batch in loader:
            crops += [{"jpg": row.clone(), "cls": 0} for row in batch["jpg"]]
            if len(crops) >= 256:
                break
    return rate, crops


_CROPS = []


def _fn_over_crops(part):
    torch.set_num_threads(1)
    for sample in _CROPS[part::2]:
        after_native_crop(sample)
    return len(_CROPS[part::2])


def fn_alone(crops, seconds):
    """after_native_crop over ready crops in 2 forked processes, nothing else: samples/s."""
    import multiprocessing
    _CROPS[:] = crops
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_fn_over_crops, [0, 1])  # warm-up
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            done += sum(pool.map(_fn_over_crops, [0, 1]))
        return done / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=64)
    common.add_epoch_options(parser, "map", seconds=4.0)
    args = parser.parse_args()

    out = common.empty_folder(args.out)
    zerowait.generate_imagefolder(out / "jpeg", files=args.files, classes=10, seed=0,
                                  min_bytes=60_000, max_bytes=160_000)
    zerowait.pack(out / "jpeg", out / "shards", imagefolder=True)
    classes = sorted(p.name for p in (out / "jpeg").iterdir())
    paths = sorted((out / "jpeg").rglob("*.jpg"))
    labels = [classes.index(p.parent.name) for p in paths]
    with Image.open(paths[0]) as image:
        size = image.size
    mean_kb = sum(p.stat().st_size for p in paths) / len(paths) / 1e3
    common.log(f"{len(paths)} JPEGs, {mean_kb:.0f} KB each on average (first {size[0]}x{size[1]})",
               tag="map")

    peer = torch.utils.data.DataLoader(Files(paths, labels), batch_size=args.batch_size,
                                       shuffle=True, num_workers=2, persistent_workers=True)
    whole = zerowait.Loader(out / "shards", args.batch_size, decode={"cls": "int"},
                            map=whole_pipeline, map_workers=2)
    native = zerowait.Loader(out / "shards", args.batch_size,
                             decode={"jpg": zerowait.RandomResizedCrop(224), "cls": "int"},
                             map=after_native_crop, map_workers=2)

    def peer_pids():
        return [w.pid for w in peer._iterator._workers]

    rows = {
        "DataLoader(num_workers=2): files, Pillow + torchvision v2":
            (lambda: sum(len(b[1]) for b in peer), peer_pids),
        "zerowait map, process x2: the whole pipeline in fn":
            (lambda: sum(len(b["cls"]) for b in whole),
             lambda: whole.stats()["map"]["worker_pids"]),
        "zerowait RandomResizedCrop(224) + map, process x2: fn = ColorJitter + RandAugment":
            (lambda: sum(len(b["cls"]) for b in native),
             lambda: native.stats()["map"]["worker_pids"]),
    }
    results = {}
    for name, (epoch, pids) in rows.items():
        common.log(name, tag="map")
        rate, epochs = common.timed_epochs(epoch, args.seconds)
        results[name] = {"samples_per_s": rate, "epochs": epochs, "workers": memory(pids())}
    waits = {n: l.stats()["map"] for n, l in (("whole", whole), ("native", native))}
    whole.close()
    native.close()
    # The native row's bound: every sample needs its decode + crop and its fn, on the same two
    # CPUs, so with a free map stage the rate is at most 1 / (1 / decode rate + 1 / fn rate).
    decode_rate, crops = decode_alone(out / "shards", args.batch_size, args.seconds)
    fn_rate = fn_alone(crops, args.seconds)
    bound = 1 / (1 / decode_rate + 1 / fn_rate)

    print(f"\nzerowait map benchmark: {len(paths)} synthetic JPEGs ({mean_kb:.0f} KB on average), "
          f"decode + RandomResizedCrop(224) + ColorJitter + RandAugment, batch {args.batch_size}, "
          "2 worker processes each, 2 CPUs, page cache warm\n")
    print(f"{'row':<84} {'epochs':>6} {'samples/s':>10} {'MiB/worker':>18}")
    print("-" * 122)
    for name, r in results.items():
        mib = " ".join(f"{rss / 2**20:.0f}/{unique / 2**20:.0f}" for rss, unique in r["workers"])
        print(f"{name:<84} {r['epochs']:>6} {r['samples_per_s']:>10,.0f} {mib:>18}")
    names = list(results)
    base = results[names[0]]["samples_per_s"]
    ratios = [common.ratio("zerowait map (whole pipeline) / DataLoader",
                           results[names[1]]["samples_per_s"] / base, 1.5, True),
              common.ratio("zerowait decode + map / DataLoader",
                           results[names[2]]["samples_per_s"] / base, 1.5, True),
              {"name": "bound of the decode + map row / DataLoader", "value": bound / base,
               "goal": "-", "result": "info"},
              {"name": "zerowait decode + map / its bound", "value":
               results[names[2]]["samples_per_s"] / bound, "goal": "-", "result": "info"}]
    common.print_ratios(ratios, [
        "MiB/worker: RSS/unique per worker process (unique: pages not shared with the parent)",
        f"bound: zerowait's decode + crop alone, 2 threads: {decode_rate:,.0f} samples/s; "
        f"ColorJitter + RandAugment + PILToTensor alone on its crops, 2 processes: "
        f"{fn_rate:,.0f} samples/s; each sample needs both on the same 2 CPUs: at most "
        f"{bound:,.0f} samples/s with a map stage that cost nothing",
        f"time next() waited on fn: whole {waits['whole']['wait_s']:.1f} s, "
        f"native {waits['native']['wait_s']:.1f} s"], name_width=66)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "ratios": ratios,
                                         "decode_rate": decode_rate, "fn_rate": fn_rate},
                                        indent=1))


if __name__ == "__main__":
    main()
