"""PNG and WebP fields through the Loader's image transforms, against Pillow itself: Resize +
CenterCrop of a PNG, a lossless WebP and a palette PNG with transparency come out as Pillow's
convert("RGB").resize(BILINEAR).crop() within one level; a damaged one is a named corrupt
sample."""

from __future__ import annotations

import io

import numpy as np
import pytest

import zerowait
from PIL import Image


def picture(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, (x * 7 + y * 13) % 256], axis=-1)
    noise = rng.integers(0, 16, rgb.shape)
    return Image.fromarray((rgb + noise).clip(0, 255).astype(np.uint8))


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def pillow_center_crop(data: bytes, size: int) -> np.ndarray:
    """torchvision's Resize(round(size * 256 / 224)) + CenterCrop(size) on a PIL image."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    short = round(size * 256 / 224)
    w, h = image.size
    new = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    image = image.resize(new, Image.BILINEAR)
    left, top = round((new[0] - size) / 2), round((new[1] - size) / 2)
    return np.asarray(image.crop((left, top, left + size, top + size)))


def test_png_and_webp_decode_like_pillow(tmp_path):
    images = [picture(90 + 13 * i, 70 + 7 * i, i) for i in range(6)]
    palette = images[0].convert("P", palette=Image.ADAPTIVE, colors=64)
    palette.info["transparency"] = 3
    samples = []
    for i, image in enumerate(images):
        samples.append({"__key__": f"png{i}", "img": encoded(image, "PNG")})
        samples.append({"__key__": f"webp{i}", "img": encoded(image, "WEBP", lossless=True)})
        samples.append({"__key__": f"rgba{i}", "img": encoded(image.convert("RGBA"), "PNG")})
    samples.append({"__key__": "palette", "img": encoded(palette, "PNG", transparency=3)})
    zerowait.write_dataset(samples, tmp_path / "ds")

    loader = zerowait.Loader(tmp_path / "ds", batch_size=8, shuffle="none", keys=True,
                             decode={"img": zerowait.CenterCrop(32)}, output="numpy")
    got = {}
    for batch in loader:
        for key, pixels in zip(batch["__key__"], batch["img"]):
            got[key] = pixels
    assert len(got) == len(samples)
    for sample in samples:
        expected = pillow_center_crop(sample["img"], 32).astype(int)
        assert np.abs(got[sample["__key__"]].astype(int) - expected).max() <= 1, sample["__key__"]
    for i in range(len(images)):
        assert np.array_equal(got[f"png{i}"], got[f"webp{i}"])
        assert np.array_equal(got[f"png{i}"], got[f"rgba{i}"])  # alpha dropped, not composited


def test_a_damaged_png_or_webp_is_a_named_corrupt_sample(tmp_path):
    good = encoded(picture(64, 48, 1), "PNG")
    webp = encoded(picture(64, 48, 2), "WEBP", lossless=True)
    samples = [{"__key__": "good", "img": good},
               {"__key__": "cut-webp", "img": webp[: len(webp) // 2]},
               {"__key__": "gif", "img": b"GIF89a" + bytes(40)}]
    # write_dataset checks only JPEG and PNG fields it can recognise by name: "img" is neither.
    zerowait.write_dataset(samples, tmp_path / "ds")
    options = dict(batch_size=4, shuffle="none", decode={"img": zerowait.CenterCrop(16)})
    with pytest.raises(zerowait.CorruptDataError, match="key 'cut-webp'.*WebP decode failed"):
        list(zerowait.Loader(tmp_path / "ds", **options))
    loader = zerowait.Loader(tmp_path / "ds", on_corrupt="skip", keys=True, **options)
    assert [k for b in loader for k in b["__key__"]] == ["good"]
    assert loader.stats()["skipped"] == 2
