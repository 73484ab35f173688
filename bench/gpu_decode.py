"""GPU JPEG decode (bench/gpu.py section "decode"): RandomResizedCrop(224) decoded on the GPU by
zerowait.Loader against the CPU path on every core and against torchvision's GPU decode +
resized_crop of the same batches, in one process, on the same shards.

Data: ImageNet-like synthetic photographs from zerowait's own generator (about 500x375 pixels,
40-80 KB each; 3,000 at --scale full, 64 at small), packed with imagefolder=True. Rows, each
timed over a whole epoch after a warm-up epoch (page cache, arenas and the CUDA context warm),
the best of two, torch.cuda.synchronize() before the clock stops:

- zerowait GPU: Loader(device="cuda", decode={"jpg": RandomResizedCrop(224, flip=True,
  device="cuda")}): headers on the loader's threads, nvJPEG batched decode, the crop resampled
  on the GPU;
- zerowait CPU: the same with the transform on the CPU (libjpeg-turbo at the DCT scale the crop
  needs), threads = every core, batches copied to the GPU (device="cuda");
- torchvision GPU: what a peer writes: the same batches' JPEG bytes already in memory (read once
  beforehand, so this row pays no I/O), torchvision.io.decode_jpeg(list, device="cuda"), then
  torchvision's resized_crop(antialias=True) + flip per image with the same crop boxes, stacked.

Pixel rows: mean and max absolute difference of the GPU path's images against the CPU path's
with dct_downscale off (same filter, so nvJPEG against libjpeg) and on (the CPU default).
"""

from __future__ import annotations

import os
import time

SIZE = 224
BATCH = 256
SEED = 11


def run(args) -> dict:
    import zerowait

    full = args.scale == "full"
    files = 3000 if full else 64
    batch = BATCH if full else 16
    data = prepare(args.work / "gpu-decode", files)
    threads = os.cpu_count() or 1
    gpu_transform = zerowait.RandomResizedCrop(SIZE, flip=True, device="cuda")
    cpu_transform = zerowait.RandomResizedCrop(SIZE, flip=True)

    def loader_epoch(transform, **options):
        loader = zerowait.Loader(data, batch_size=batch, seed=SEED, device="cuda",
                                 decode={"jpg": transform, "cls": "int"}, **options)
        return timed_epochs(loader, lambda b: b["jpg"])

    gpu_s, gpu_n, gpu_stats = loader_epoch(gpu_transform)
    cpu_s, cpu_n, _ = loader_epoch(cpu_transform, threads=threads)
    tv_s, tv_n = torchvision_epochs(data, batch, gpu_transform)
    rows = [
        dict(path="zerowait GPU decode", threads="default", samples=gpu_n, seconds=gpu_s,
             samples_per_s=gpu_n / gpu_s),
        dict(path="zerowait CPU decode", threads=threads, samples=cpu_n, seconds=cpu_s,
             samples_per_s=cpu_n / cpu_s),
        dict(path="torchvision GPU decode + resized_crop", threads=1, samples=tv_n,
             seconds=tv_s, samples_per_s=tv_n / tv_s),
    ]
    rows += pixel_rows(data, batch)
    versus_cpu = (gpu_n / gpu_s) / (cpu_n / cpu_s)
    versus_tv = (gpu_n / gpu_s) / (tv_n / tv_s)
    ratios = [
        ratio("zerowait GPU decode / zerowait CPU decode on every core (samples/s)",
              versus_cpu, 1.0),
        ratio("zerowait GPU decode / torchvision GPU decode + resized_crop (samples/s)",
              versus_tv, 1.0),
    ]
    notes = [
        f"{files} synthetic ~500x375 JPEGs, batch {batch}, RandomResizedCrop({SIZE}, flip); "
        f"each row the best of 2 epochs after a warm-up epoch; CPU path on {threads} threads",
        "torchvision row: bytes already in memory (no I/O), decode_jpeg(list, device='cuda') "
        "then resized_crop(antialias=True) per image with the loader's own crop boxes",
        f"GPU stage: {gpu_stats}",
    ]
    return {"rows": rows, "ratios": ratios, "notes": notes}


def prepare(work, files):
    """Shards of `files` generated photographs under `work` (reused when already there)."""
    import zerowait

    shards = work / f"shards-{files}"
    if not (shards / "manifest.json").exists():
        images = work / f"images-{files}"
        zerowait.generate_imagefolder(images, files=files, classes=10, seed=SEED,
                                      min_bytes=40000, max_bytes=80000)
        zerowait.pack(images, shards, imagefolder=True, sync=False)
    return shards


def timed_epochs(loader, images_of, epochs=2):
    """(best seconds, samples, stats) of whole epochs after a warm-up one."""
    import torch

    best, samples = float("inf"), 0
    for epoch in range(epochs + 1):
        loader.set_epoch(epoch)
        torch.cuda.synchronize()
        start, samples = time.perf_counter(), 0
        for batch in loader:
            images_of(batch)
            samples += len(batch["__index__"])
        torch.cuda.synchronize()
        if epoch > 0:
            best = min(best, time.perf_counter() - start)
    stats = loader.stats().get("gpu_decode")
    loader.close()
    return best, samples, stats


def torchvision_epochs(data, batch, transform, epochs=2):
    """(best seconds, samples) of torchvision's GPU decode + resized_crop over the loader's
    batches, their bytes and crop boxes read beforehand."""
    import torch
    import torchvision.io as tvio
    from torchvision.transforms.v2 import functional as F

    import zerowait

    reader = zerowait.Loader(data, batch_size=batch, seed=SEED, fields=["jpg"])
    batches = []
    for b in reader:
        offsets = b["jpg.offsets"]
        jpegs = [b["jpg"][int(offsets[i]):int(offsets[i + 1])].clone()
                 for i in range(len(offsets) - 1)]
        batches.append((jpegs, b["__index__"].tolist()))
    reader.close()
    cpu_transform = transform.transform
    best = float("inf")
    samples = 0
    boxes = {}
    for epoch in range(epochs + 1):
        torch.cuda.synchronize()
        start, samples = time.perf_counter(), 0
        for jpegs, indices in batches:
            images = tvio.decode_jpeg(jpegs, mode=tvio.ImageReadMode.RGB, device="cuda")
            out = []
            for image, index in zip(images, indices):
                key = (index, image.shape[2], image.shape[1])
                if key not in boxes:  # the peer draws its own boxes: not part of the timing
                    boxes[key] = cpu_transform.crop_area(image.shape[2], image.shape[1],
                                                         seed=SEED, index=index)
                x0, y0, x1, y1, flip = boxes[key]
                crop = F.resized_crop(image, int(y0), int(x0), int(y1 - y0), int(x1 - x0),
                                      [SIZE, SIZE], antialias=True)
                out.append(F.horizontal_flip(crop) if flip else crop)
            torch.stack(out)
            samples += len(jpegs)
        torch.cuda.synchronize()
        if epoch > 0:
            best = min(best, time.perf_counter() - start)
    return best, samples


def pixel_rows(data, batch):
    """Mean and max |GPU - CPU| over the first batches, dct_downscale off and on."""
    import torch

    import zerowait

    def images(transform, limit=4):
        loader = zerowait.Loader(data, batch_size=batch, seed=SEED, decode={"jpg": transform},
                                 device="cuda")
        out = []
        for i, b in enumerate(loader):
            if i == limit:
                break
            out.append(b["jpg"].cpu())
        loader.close()
        return torch.cat(out)

    gpu = images(zerowait.RandomResizedCrop(SIZE, flip=True, device="cuda"))
    rows = []
    for dct in (False, True):
        cpu = images(zerowait.RandomResizedCrop(SIZE, flip=True, dct_downscale=dct))
        d = (gpu.int() - cpu.int()).abs()
        per_image = d.flatten(1).float().mean(1)
        rows.append(dict(path=f"pixels GPU vs CPU (dct_downscale={dct})", samples=len(gpu),
                         mean_abs_diff=float(d.float().mean()), max_abs_diff=int(d.max()),
                         worst_image_mean=float(per_image.max())))
    return rows


def ratio(name, value, goal):
    return {"name": name, "value": value, "goal": f">= {goal}",
            "result": "PASS" if value >= goal else "FAIL"}
