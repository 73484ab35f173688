"""GPU JPEG decode (``RandomResizedCrop(..., device="cuda")``) tested without a GPU: the crop rows
the loader's threads emit are the CPU path's crops, and the GPU stage's resampler, run on CPU
tensors with Pillow standing in for nvJPEG (its CPU twin), reproduces the CPU loader's images;
images the GPU would not decode like libjpeg come decoded by the CPU threads; corrupt samples
follow on_corrupt; an exact resume gives the same crops. test_gpu_decode.py runs the real
thing on the GPU machine."""

from __future__ import annotations

import warnings

import pytest
import torch

import zerowait
from zerowait import gpu_decode
from decode_samples import abs_diff, images_by_index, jpeg_dataset, mixed_dataset, pil_decoder
from decode_samples import jpegs, photos  # noqa: F401 - the shared fixtures


@pytest.fixture()
def cpu_twin(monkeypatch):
    """The GPU stage on this machine's CPU, with Pillow decoding: records what it was given."""
    seen = {"jpegs": 0, "crops": []}

    def decode(jpegs, device):
        seen["jpegs"] += len(jpegs)
        return pil_decoder(jpegs, device)

    resample = gpu_decode.resized_crop

    def spy(images, crops, mode, size):
        seen["crops"].append(crops.clone())
        return resample(images, crops, mode, size)

    monkeypatch.setattr(gpu_decode, "stage_device", lambda device, fields: torch.device("cpu"))
    monkeypatch.setattr(gpu_decode, "torchvision_decoder", lambda: (decode, ""))
    monkeypatch.setattr(gpu_decode, "resized_crop", spy)
    monkeypatch.setattr(gpu_decode, "probe_decoder", lambda decode, device: "")  # not counted
    return seen


def load(data, transform, field="img", **options):
    return list(zerowait.Loader(data, batch_size=8, seed=5, decode={field: transform}, **options))


def test_crop_rows_are_the_cpu_paths_crops_for_each_header(photos, jpegs, cpu_twin):
    from PIL import Image
    import io

    transform = zerowait.RandomResizedCrop(48, flip=True)
    for epoch in (0, 3):
        cpu_twin["crops"].clear()
        batches = load(photos, zerowait.RandomResizedCrop(48, flip=True, device="cuda"),
                       epoch=epoch)
        crops = torch.cat(cpu_twin["crops"])
        indices = torch.cat([b["__index__"] for b in batches]).tolist()
        assert len(indices) == len(jpegs) == len(crops)
        flips = set()
        for row, index in zip(crops.tolist(), indices):
            width, height = Image.open(io.BytesIO(jpegs[index])).size
            x0, y0, x1, y1, flip = transform.crop_area(width, height, seed=5, epoch=epoch,
                                                       index=index)
            assert row == [x0, y0, x1, y1, float(flip), width, height, 0.0]
            flips.add(flip)
        assert flips == {True, False}


@pytest.mark.parametrize("make", [
    lambda **kw: zerowait.RandomResizedCrop(64, flip=True, **kw),
    lambda **kw: zerowait.CenterCrop(64, **kw),
], ids=["random_resized_crop", "center_crop"])
def test_the_twin_reproduces_the_cpu_loaders_images(photos, cpu_twin, make):
    twin = images_by_index(load(photos, make(device="cuda")))
    full = images_by_index(load(photos, make(dct_downscale=False)))
    scaled = images_by_index(load(photos, make()))
    assert cpu_twin["jpegs"] == len(twin) == len(full)
    mean, worst = abs_diff(torch.stack(list(twin.values())), torch.stack(list(full.values())))
    # The same full-resolution pixels, the same integer filter: the CPU path differs only where
    # libjpeg's cropped decode (jpeg_crop_scanline) upsamples chroma at the crop's left and right
    # edges as if they were the image's (measured: mean 0.0013, max 3 levels).
    assert mean < 0.01 and worst <= 4, (mean, worst)
    # DCT-domain downscaling is a different (coarser) filter (measured: mean 0.6, max 30).
    mean, worst = abs_diff(torch.stack(list(twin.values())), torch.stack(list(scaled.values())))
    assert mean < 1.5, (mean, worst)


def test_a_whole_image_crop_is_bit_identical_to_the_cpu_loader(tmp_path, jpegs, cpu_twin):
    from PIL import Image
    import io

    same_size = [reencode_at(jpeg, 320, 240) for jpeg in jpegs[:12]]
    jpeg_dataset(tmp_path / "ds", same_size)
    ratio = (320 / 240, 320 / 240)
    whole = dict(scale=(1.0, 1.0), ratio=ratio, flip=True)
    twin = images_by_index(load(tmp_path / "ds", zerowait.RandomResizedCrop(56, device="cuda",
                                                                           **whole)))
    cpu = images_by_index(load(tmp_path / "ds", zerowait.RandomResizedCrop(
        56, dct_downscale=False, **whole)))
    assert twin.keys() == cpu.keys()
    for index in twin:
        assert torch.equal(twin[index], cpu[index]), index
    assert Image.open(io.BytesIO(same_size[0])).size == (320, 240)


def reencode_at(jpeg: bytes, width: int, height: int) -> bytes:
    from PIL import Image
    import io

    out = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).resize((width, height)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_png_grayscale_and_cmyk_come_decoded_by_the_cpu_threads(tmp_path, jpegs, cpu_twin):
    kinds = mixed_dataset(tmp_path / "ds", jpegs)
    twin = load(tmp_path / "ds", zerowait.RandomResizedCrop(40, device="cuda"), keys=True)
    cpu = load(tmp_path / "ds", zerowait.RandomResizedCrop(40), keys=True)
    on_cpu = 0
    for a, b in zip(twin, cpu):
        assert a["__key__"] == b["__key__"]
        for key, x, y in zip(a["__key__"], a["img"], b["img"]):
            if kinds[key] != "jpeg":  # the CPU path's own pixels, dct_downscale included
                assert torch.equal(x, y), key
                on_cpu += 1
    assert on_cpu == sum(kind != "jpeg" for kind in kinds.values())
    assert cpu_twin["jpegs"] == len(kinds) - on_cpu


def test_an_exact_resume_gives_the_same_crops(photos, cpu_twin):
    transform = zerowait.RandomResizedCrop(40, flip=True, device="cuda")
    straight = load(photos, transform)
    loader = zerowait.Loader(photos, batch_size=8, seed=5, decode={"img": transform})
    first = loader.next()
    state = loader.state_dict()
    resumed = zerowait.Loader(photos, batch_size=8, seed=5, decode={"img": transform})
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert torch.equal(first["img"], straight[0]["img"])
    for a, b in zip(rest, straight[1:]):
        assert torch.equal(a["__index__"], b["__index__"]) and torch.equal(a["img"], b["img"])
    assert len(rest) == len(straight) - 1


def test_a_truncated_jpeg_is_a_named_corrupt_sample(tmp_path, jpegs, cpu_twin):
    keys = jpeg_dataset(tmp_path / "ds", jpegs[:16], truncated=5)
    transform = zerowait.CenterCrop(40, device="cuda")
    loader = zerowait.Loader(tmp_path / "ds", batch_size=8, shuffle="none",
                             decode={"img": transform})
    with pytest.raises(zerowait.CorruptDataError, match=f"{keys[5]}.*truncated"):
        list(loader)
    skipping = zerowait.Loader(tmp_path / "ds", batch_size=8, shuffle="none",
                               decode={"img": transform}, on_corrupt="skip")
    indices = torch.cat([b["__index__"] for b in skipping]).tolist()
    assert indices == [i for i in range(16) if i != 5]
    assert skipping.stats()["skipped"] == 1


def test_an_image_the_gpu_decoder_rejects_follows_on_corrupt(tmp_path, jpegs, monkeypatch,
                                                              cpu_twin):
    keys = jpeg_dataset(tmp_path / "ds", jpegs[:16])
    bad = jpegs[6]

    def picky(batch, device):  # nvJPEG refusing one image fails the whole batched call
        if any(bytes(j.numpy()) == bad for j in batch):
            raise RuntimeError("nvjpegDecodeBatched failed: 6")
        return pil_decoder(batch, device)

    monkeypatch.setattr(gpu_decode, "torchvision_decoder", lambda: (picky, ""))
    transform = zerowait.RandomResizedCrop(32, device="cuda")
    loader = zerowait.Loader(tmp_path / "ds", batch_size=8, shuffle="none",
                             decode={"img": transform, "cls": "int"})
    with pytest.raises(zerowait.CorruptDataError, match=f"{keys[6]}.*GPU JPEG decode failed"):
        loader.next()
    batch = loader.next()  # the same batch, without the sample
    assert batch["__index__"].tolist() == [0, 1, 2, 3, 4, 5, 7]
    assert batch["cls"].tolist() == [0, 1, 0, 1, 0, 1, 1]
    assert tuple(batch["img"].shape) == (7, 32, 32, 3)
    rest = list(loader)
    assert len(rest) == 1 and len(rest[0]["__index__"]) == 8
    skipping = zerowait.Loader(tmp_path / "ds", batch_size=8, shuffle="none",
                               decode={"img": transform}, on_corrupt="skip")
    assert sum(len(b["__index__"]) for b in skipping) == 15
    assert skipping.stats()["skipped"] == 1
    assert skipping.stats()["gpu_decode"]["failed"] == 1


def test_gpu_decode_without_cuda_or_with_a_cpu_loader_is_a_clear_error(photos):
    transform = zerowait.RandomResizedCrop(32, device="cuda")
    assert "device='cuda'" in repr(transform)
    with pytest.raises(ValueError, match="needs Loader\\(device='cuda'\\)"):
        zerowait.Loader(photos, decode={"img": transform})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch.cuda is not available"):
            zerowait.Loader(photos, decode={"img": transform}, device="cuda")
    with pytest.raises(ValueError, match="map="):
        zerowait.Loader(photos, decode={"img": transform}, device="cuda", map=lambda s: s)


def test_the_decoder_is_probed_once_and_a_failing_one_means_the_cpu_decodes(photos,
                                                                            monkeypatch):
    assert gpu_decode.probe_decoder(pil_decoder, torch.device("cpu")) == ""

    def no_nvjpeg(jpegs, device):
        raise RuntimeError("decode_jpegs_cuda: torchvision not compiled with nvJPEG support")

    monkeypatch.setattr(gpu_decode, "stage_device", lambda device, fields: torch.device("cpu"))
    monkeypatch.setattr(gpu_decode, "torchvision_decoder", lambda: (no_nvjpeg, ""))
    with pytest.warns(RuntimeWarning, match="not compiled with nvJPEG"):
        loader = zerowait.Loader(photos, batch_size=8, decode={"img": zerowait.RandomResizedCrop(
            32, device="cuda", scale=(0.5, 1.0))})
    assert sum(len(b["__index__"]) for b in loader) == 32  # decoded by the threads, none lost
    assert "not compiled with nvJPEG" in loader.stats()["gpu_decode"]["fallback"]


def test_without_torchvision_the_cpu_threads_decode_and_say_so(photos, monkeypatch):
    monkeypatch.setattr(gpu_decode, "stage_device", lambda device, fields: torch.device("cpu"))
    monkeypatch.setattr(gpu_decode, "torchvision_decoder",
                        lambda: (None, "torchvision does not import (test)"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = zerowait.Loader(photos, batch_size=8, seed=5,
                                 decode={"img": zerowait.CenterCrop(32, device="cuda")})
    assert any("GPU JPEG decode is not available" in str(w.message) for w in caught)
    fallback = images_by_index(loader)
    assert loader.stats()["gpu_decode"]["fallback"] == "torchvision does not import (test)"
    cpu = images_by_index(load(photos, zerowait.CenterCrop(32)))
    assert fallback.keys() == cpu.keys()
    assert all(torch.equal(fallback[i], cpu[i]) for i in cpu)
