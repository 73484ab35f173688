"""PNG and WebP benchmark: decode + RandomResizedCrop(224) + flip by zerowait.Loader against
Pillow in a PyTorch DataLoader, on 2 CPUs each, over the same images.

The images are the quick start's synthetic photographs (`zerowait generate imagefolder`, JPEGs of
smooth shapes and noise), re-encoded with Pillow as PNG and as WebP (quality 90), --files of
each. Rows, each timed over epochs after a warm-up epoch (page cache warm):

- zerowait: the images written into shards with zerowait.write_dataset, read by
  zerowait.Loader(decode={"img": RandomResizedCrop(224, flip=True)}, threads=2);
- Pillow + torchvision: the same images as files, a torch Dataset that opens each with Pillow,
  convert("RGB"), torchvision's RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor, in
  DataLoader(batch_size, shuffle=True, num_workers=2). Where torchvision cannot be imported
  (common.import_torchvision), the same transform is done with the Pillow calls torchvision
  makes for a PIL image (crop, resize with BILINEAR, transpose), and the row says so;
- Pillow decode only: the same DataLoader decoding each file to RGB and dropping it, for
  information: the part of the peer's time that is the decoders' own.

Goal (issue 11): zerowait >= 2x the Pillow row, per format.

Usage: bench/run image-formats [--files 1500] [--batch-size 64] [--seconds 3] [--out DIR]
                               [--json FILE]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import sys
from pathlib import Path

import numpy as np
import torch

import zerowait
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

FORMATS = {"png": ("PNG", {}), "webp": ("WEBP", {"quality": 90})}


def torchvision_transform():
    """torchvision's RandomResizedCrop(224) + flip + PILToTensor, or None without torchvision."""
    torchvision = common.import_torchvision()
    if torchvision is None:
        return None
    transforms = torchvision.transforms
    return transforms.Compose([transforms.RandomResizedCrop(224),
                               transforms.RandomHorizontalFlip(), transforms.PILToTensor()])


def pillow_random_resized_crop(image, rng):
    """What torchvision's RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor do to a PIL
    image: get_params' box, image.resize((224, 224), BILINEAR, box=...), a transpose with p=0.5."""
    width, height = image.size
    area = width * height
    box = None
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            box = (x, y, x + w, y + h)
            break
    if box is None:
        box = (0, 0, width, height)
    out = image.resize((224, 224), Image.BILINEAR, box=box)
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(out).copy()).permute(2, 0, 1)


class Files(torch.utils.data.Dataset):
    """Image files opened with Pillow; `transform` None: torchvision's calls done by hand;
    "decode only": the image decoded to RGB and dropped (the row's floor)."""

    def __init__(self, paths, transform):
        self.paths, self.transform = paths, transform
        self.rng = random.Random(0)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as image:
            rgb = image.convert("RGB")
        if self.transform == "decode only":
            return torch.zeros(1, dtype=torch.uint8)
        if self.transform is not None:
            return self.transform(rgb)
        return pillow_random_resized_crop(rgb, self.rng)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=64)
    common.add_epoch_options(parser, "image-formats", seconds=3.0)
    args = parser.parse_args()

    out = common.empty_folder(args.out)
    zerowait.generate_imagefolder(out / "jpeg", files=args.files, classes=10, seed=0,
                                  min_bytes=20_000, max_bytes=80_000)
    jpegs = sorted((out / "jpeg").rglob("*.jpg"))
    transform = torchvision_transform()
    peer = ("Pillow + torchvision" if transform is not None else
            "Pillow (torchvision's calls; no torchvision here)")
    results, sizes = {}, {}
    for fmt, (pil_name, options) in FORMATS.items():
        folder = out / fmt
        folder.mkdir()
        paths, samples = [], []
        for i, jpeg in enumerate(jpegs):
            with Image.open(jpeg) as image:
                data = io.BytesIO()
                image.convert("RGB").save(data, format=pil_name, **options)
            path = folder / f"{i:06d}.{fmt}"
            path.write_bytes(data.getvalue())
            paths.append(path)
            samples.append({"img": data.getvalue()})
        sizes[fmt] = sum(len(s["img"]) for s in samples) / len(samples)
        zerowait.write_dataset(samples, out / f"{fmt}-shards", sync=False)
        common.log(f"{len(paths)} {fmt} images, {sizes[fmt] / 1e3:.0f} KB each on average",
                   tag="image-formats")

        loader = zerowait.Loader(out / f"{fmt}-shards", batch_size=args.batch_size, threads=2,
                                 fields=["img"],
                                 decode={"img": zerowait.RandomResizedCrop(224, flip=True)})
        def files_loader(files_transform):
            return torch.utils.data.DataLoader(Files(paths, files_transform),
                                               batch_size=args.batch_size, shuffle=True,
                                               num_workers=2, persistent_workers=True)
        peer_loader, decode_loader = files_loader(transform), files_loader("decode only")
        rows = {f"zerowait {fmt}": lambda: sum(len(b["img"]) for b in loader),
                f"{peer} {fmt}": lambda: sum(len(b) for b in peer_loader),
                f"Pillow decode only (no crop, no resize) {fmt}":
                    lambda: sum(len(b) for b in decode_loader)}
        for name, epoch in rows.items():
            common.log(name, tag="image-formats")
            rate, epochs = common.timed_epochs(epoch, args.seconds)
            results[name] = {"samples_per_s": rate, "epochs": epochs}
        loader.close()

    print(f"\nzerowait PNG/WebP benchmark: {args.files} synthetic photographs per format "
          f"(PNG {sizes['png'] / 1e3:.0f} KB, WebP q90 {sizes['webp'] / 1e3:.0f} KB on average), "
          f"RandomResizedCrop(224) + flip, batch {args.batch_size}, 2 threads vs 2 workers, page "
          "cache warm\n")
    print(f"{'row':<60} {'epochs':>6} {'samples/s':>10}")
    print("-" * 78)
    for name, r in results.items():
        print(f"{name:<60} {r['epochs']:>6} {r['samples_per_s']:>10,.0f}")
    ratios = [common.ratio(f"zerowait / {peer.split(' (')[0]}, {fmt}",
                           results[f"zerowait {fmt}"]["samples_per_s"]
                           / results[f"{peer} {fmt}"]["samples_per_s"], 2.0, True)
              for fmt in FORMATS]
    ratios += [{"name": f"zerowait / Pillow decode only, {fmt}",
                "value": results[f"zerowait {fmt}"]["samples_per_s"]
                / results[f"Pillow decode only (no crop, no resize) {fmt}"]["samples_per_s"],
                "goal": "-", "result": "info"} for fmt in FORMATS]
    common.print_ratios(ratios, [f"peer row: {peer}",
                                 "Pillow decode only: Image.open + convert('RGB') in the same "
                                 "DataLoader, the result dropped: what the peer's decoding alone "
                                 "costs (its wheel's zlib-ng and libwebp 1.6; zerowait uses "
                                 "Debian's zlib 1.2.13 and libwebp 1.2.4)"])
    if args.json:
        args.json.write_text(json.dumps({"results": results, "ratios": ratios,
                                         "sizes": sizes, "peer": peer}, indent=1))


if __name__ == "__main__":
    main()
