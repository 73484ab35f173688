"""GPU JPEG decode on a real GPU: ``RandomResizedCrop(..., device="cuda")`` with
``Loader(device="cuda")`` gives the CPU path's crops within nvJPEG's difference from libjpeg,
the same bytes whatever the run or the thread count, the same after an exact resume, the CPU
threads' own pixels for PNG, grayscale and CMYK images, and named corrupt samples. Marked
``gpu``: they skip, saying why, without a CUDA device (scripts/gpu-check.sh runs them on the
GPU machine). test_device_image_decode.py tests the same logic off the GPU."""

from __future__ import annotations

import pytest
import torch

import zerowait
from decode_samples import abs_diff, images_by_index, jpeg_dataset, mixed_dataset
from decode_samples import jpegs, photos  # noqa: F401 - the shared fixtures

pytestmark = pytest.mark.gpu

# nvJPEG against libjpeg-turbo (ISLOW IDCT, fancy chroma upsampling), after the same crop and
# filter. Loose on purpose: the first device run prints the measured figures
# (docs/loader.md records them); a wrong crop or filter gives a mean of tens of levels.
MEAN_LEVELS_FULL = 2.0
MEAN_LEVELS_DCT = 3.0


def load(data, transform, **options):
    options.setdefault("batch_size", 16)
    options.setdefault("seed", 3)
    return list(zerowait.Loader(data, decode={"img": transform, "cls": "int"}, **options))


def gpu_images(data, transform, **options):
    batches = load(data, transform, device="cuda", **options)
    for batch in batches:
        assert batch["img"].is_cuda and batch["img"].dtype == torch.uint8
    return images_by_index(batches)


@pytest.mark.parametrize("make", [
    lambda **kw: zerowait.RandomResizedCrop(224, flip=True, **kw),
    lambda **kw: zerowait.CenterCrop(224, **kw),
], ids=["random_resized_crop", "center_crop"])
def test_gpu_images_match_the_cpu_path_within_decoder_tolerance(photos, make):
    # A small pool (memory budget, prefetch): arenas come back fast, so a host batch released
    # before the GPU read it would show up as a wrong image.
    gpu = gpu_images(photos, make(device="cuda"), prefetch=1, memory_budget=64 << 20)
    assert len(gpu) == 32
    for dct, limit in ((False, MEAN_LEVELS_FULL), (True, MEAN_LEVELS_DCT)):
        cpu = images_by_index(load(photos, make(dct_downscale=dct)))
        assert cpu.keys() == gpu.keys()
        per_image = [abs_diff(gpu[i], cpu[i]) for i in cpu]
        mean = sum(m for m, _ in per_image) / len(per_image)
        worst = max(w for _, w in per_image)
        print(f"GPU vs CPU dct_downscale={dct}: mean {mean:.3f} max {worst} levels")
        assert mean < limit, (dct, mean, worst)
        assert max(m for m, _ in per_image) < 4 * limit, per_image


def test_gpu_decode_is_deterministic_across_runs_and_thread_counts(photos):
    transform = zerowait.RandomResizedCrop(96, flip=True, device="cuda")
    first = gpu_images(photos, transform, threads=1)
    again = gpu_images(photos, transform, threads=4)
    assert first.keys() == again.keys()
    for i in first:
        assert torch.equal(first[i], again[i]), i


def test_an_exact_resume_gives_the_same_gpu_images(photos):
    transform = zerowait.RandomResizedCrop(64, flip=True, device="cuda")
    straight = load(photos, transform, device="cuda")
    loader = zerowait.Loader(photos, batch_size=16, seed=3, device="cuda",
                             decode={"img": transform, "cls": "int"})
    loader.next()
    resumed = zerowait.Loader(photos, batch_size=16, seed=3, device="cuda",
                              decode={"img": transform, "cls": "int"})
    resumed.load_state_dict(loader.state_dict())
    rest = list(resumed)
    assert len(rest) == len(straight) - 1
    for a, b in zip(rest, straight[1:]):
        assert torch.equal(a["__index__"].cpu(), b["__index__"].cpu())
        assert torch.equal(a["img"].cpu(), b["img"].cpu())


def test_png_grayscale_and_cmyk_rows_are_the_cpu_paths(tmp_path, jpegs):
    kinds = mixed_dataset(tmp_path / "ds", jpegs[:24])
    gpu = load(tmp_path / "ds", zerowait.RandomResizedCrop(64, device="cuda"), device="cuda",
               keys=True)
    cpu = load(tmp_path / "ds", zerowait.RandomResizedCrop(64), keys=True)
    compared = 0
    for a, b in zip(gpu, cpu):
        assert a["__key__"] == b["__key__"]
        for key, x, y in zip(a["__key__"], a["img"], b["img"]):
            if kinds[key] != "jpeg":
                assert torch.equal(x.cpu(), y), key
                compared += 1
    assert compared == sum(kind != "jpeg" for kind in kinds.values())


def test_corrupt_samples_follow_on_corrupt_and_are_named(tmp_path, jpegs):
    keys = jpeg_dataset(tmp_path / "ds", jpegs[:32], truncated=9)
    transform = zerowait.RandomResizedCrop(64, device="cuda")
    with pytest.raises(zerowait.CorruptDataError, match=keys[9]):
        load(tmp_path / "ds", transform, device="cuda", shuffle="none")
    loader = zerowait.Loader(tmp_path / "ds", batch_size=16, shuffle="none", device="cuda",
                             on_corrupt="skip", decode={"img": transform})
    indices = [i for b in loader for i in b["__index__"].tolist()]
    assert indices == [i for i in range(32) if i != 9]
    stats = loader.stats()
    assert stats["skipped"] == 1
    assert stats["gpu_decode"]["fallback"] is None
    assert stats["gpu_decode"]["jpegs_decoded_on_gpu"] == 31
