"""Datasets and decoders shared by the GPU JPEG decode tests (test_device_image_decode.py, here,
and test_gpu_decode.py, on the GPU machine): photo-like JPEGs from zerowait's own generator,
the same pictures as PNG, grayscale and CMYK JPEGs, and damaged JPEGs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import zerowait
from PIL import Image


def generated_jpegs(root: Path, files: int, seed: int = 7, min_bytes: int = 20000,
                    max_bytes: int = 60000) -> List[bytes]:
    """``files`` photo-like JPEGs (ImageNet-like sizes) from zerowait.generate_imagefolder."""
    zerowait.generate_imagefolder(root, files=files, classes=2, seed=seed, min_bytes=min_bytes,
                                  max_bytes=max_bytes)
    return [p.read_bytes() for p in sorted(root.rglob("*.jpg"))]


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> List[bytes]:
    """32 generated photographs (a module's tests share them)."""
    return generated_jpegs(tmp_path_factory.mktemp("photos"), files=32)


@pytest.fixture(scope="module")
def photos(jpegs, tmp_path_factory) -> Path:
    """The 32 photographs as a dataset (field "img")."""
    root = tmp_path_factory.mktemp("photo-set") / "ds"
    jpeg_dataset(root, jpegs)
    return root


def reencoded(jpeg: bytes, mode: str, fmt: str = "JPEG") -> bytes:
    """The picture of ``jpeg`` in another colour mode ("L", "CMYK", "RGB") or format."""
    out = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).convert(mode).save(out, format=fmt)
    return out.getvalue()


def mixed_dataset(root: Path, jpegs: List[bytes]) -> Dict[str, str]:
    """A dataset of ``jpegs`` in field "img" (the writer takes only JPEGs in a field named
    "jpg") where every fourth sample is instead the picture as a grayscale JPEG, a CMYK JPEG, a
    PNG, or a JPEG with bytes after its EOI marker (which make the loader check it with libjpeg).
    Returns {key: kind}."""
    kinds = ("gray", "cmyk", "png", "trailing")
    samples, kind_of = [], {}
    for i, jpeg in enumerate(jpegs):
        kind = kinds[i // 4 % len(kinds)] if i % 4 == 3 else "jpeg"
        data = {"gray": lambda: reencoded(jpeg, "L"), "cmyk": lambda: reencoded(jpeg, "CMYK"),
                "png": lambda: reencoded(jpeg, "RGB", "PNG"),
                "trailing": lambda: jpeg + b"\0" * 7, "jpeg": lambda: jpeg}[kind]()
        key = f"s{i:04d}"
        samples.append({"__key__": key, "img": data, "cls": str(i % 2).encode()})
        kind_of[key] = kind
    zerowait.write_dataset(samples, root)
    return kind_of


def jpeg_dataset(root: Path, jpegs: List[bytes], truncated: int = -1) -> List[str]:
    """A dataset of ``jpegs`` in field "img" (sample ``truncated`` cut to a third: a corrupt
    sample the writer would quarantine in a field named "jpg"); returns the keys."""
    samples = []
    for i, jpeg in enumerate(jpegs):
        data = jpeg[:len(jpeg) // 3] if i == truncated else jpeg
        samples.append({"__key__": f"s{i:04d}", "img": data, "cls": str(i % 2).encode()})
    zerowait.write_dataset(samples, root)
    return [s["__key__"] for s in samples]


def pil_decoder(jpegs, device):
    """Stands in for torchvision's GPU decode off the GPU: Pillow (libjpeg-turbo) decodes each
    JPEG to a uint8 [3, H, W] tensor on ``device``."""
    import torch

    images = []
    for jpeg in jpegs:
        rgb = np.array(Image.open(io.BytesIO(jpeg.numpy().tobytes())).convert("RGB"))
        images.append(torch.from_numpy(rgb).permute(2, 0, 1).contiguous().to(device))
    return images


def abs_diff(a, b):
    """(mean, max) absolute difference of two uint8 image tensors."""
    d = (a.cpu().int() - b.cpu().int()).abs()
    return float(d.float().mean()), int(d.max())


def images_by_index(batches, field: str = "img") -> dict:
    """{global index: image tensor on the CPU} over batches."""
    out = {}
    for batch in batches:
        for i, image in zip(batch["__index__"].tolist(), batch[field]):
            out[int(i)] = image.cpu()
    return out
