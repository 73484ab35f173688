"""GPU JPEG decode for ``zerowait.Loader``:
``decode={"jpg": RandomResizedCrop(224, device="cuda")}`` with ``Loader(device="cuda")``.

The loader's C++ threads read only each JPEG's header and deliver, per field, the compressed
bytes (``"jpg"``, ``"jpg.offsets"``) and a float64 ``"jpg.crop"`` row per sample: the area to
show (x0, y0, x1, y1 in pixels of the full-resolution image), flip, the image's width and height,
and ``decoded`` (1: the C++ side decoded that image itself, PNG or grayscale for instance, and
the row's bytes are its final pixels). The crops come from the same geometry and per-sample seed
as the CPU path (``ImageTransform.crop_area``). This stage decodes the JPEGs with torchvision's
batched nvJPEG decode (``torchvision.io.decode_jpeg(list, device="cuda")``) and resamples each
crop on the GPU with the CPU path's own filter: Pillow's antialiased bilinear in the same 14-bit
fixed point, horizontal pass to 8-bit rows then vertical (src/loader/decode/image/resample.cpp),
so the only difference from the CPU path with ``dct_downscale=False`` is nvJPEG's decode against
libjpeg-turbo's (docs/loader.md, "GPU JPEG decode", states the difference measured).
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from zerowait import _core
from zerowait.text_fields import drop_rows

# The columns of a "<field>.crop" row (DeviceCropColumn in
# include/zerowait/loader/image_transform.hpp).
X0, Y0, X1, Y1, FLIP, WIDTH, HEIGHT, DECODED = range(8)
_WEIGHT_BITS = 14  # resample.cpp's kWeightBits: the same integers as the CPU resampler
# A device that has not finished a batch's work in this long is stuck: say so instead of hanging.
EVENT_TIMEOUT_S = 120.0

Decoder = Callable[[List[Any], Any], List[Any]]  # (CPU uint8 tensors, device) -> [3, H, W] each
_warned_fallback = set()
_warn_lock = threading.Lock()


# ---- The resampler, on any torch device ------------------------------------------------------

def axis_taps(in0, in1, in_size, out_size: int, reverse):
    """The taps of one axis for each sample, as ResampleAxis::compute makes them (Pillow's
    precompute_coeffs), in float64 then fixed point: (first [n, out] int64, weights
    [n, out, taps] int32). ``in0``/``in1``: float64 [n], the span shown; ``in_size``: float64
    [n], the pixels the taps may read; ``reverse``: bool [n], mirrored outputs."""
    import torch

    scale = (in1 - in0) / out_size
    filter_scale = torch.clamp(scale, min=1.0)
    support = 1.0 * filter_scale
    inv_scale = 1.0 / filter_scale
    i = torch.arange(out_size, dtype=torch.float64, device=in0.device)
    center = in0[:, None] + (i + 0.5)[None, :] * scale[:, None]
    # C++ truncates toward zero, then clamps at 0: the same as flooring, then clamping.
    lo = torch.clamp(torch.trunc(center - support[:, None] + 0.5), min=0)
    hi = torch.minimum(torch.trunc(center + support[:, None] + 0.5), in_size[:, None])
    count = torch.clamp(hi - lo, min=0)
    taps = max(1, int(count.max().item()))
    k = torch.arange(taps, dtype=torch.float64, device=in0.device)
    x = ((k[None, None, :] + lo[..., None]) - center[..., None] + 0.5) * inv_scale[:, None, None]
    x = torch.abs(x)
    tap = torch.where((x < 1.0) & (k[None, None, :] < count[..., None]), 1.0 - x,
                      torch.zeros_like(x))
    total = torch.zeros_like(center)
    for j in range(taps):  # in order, as the C++ loop adds them: the same rounding
        total = total + tap[..., j]
    normalized = torch.where(total[..., None] != 0.0, tap / total[..., None], tap)
    fixed = torch.trunc(normalized * (1 << _WEIGHT_BITS) + 0.5).to(torch.int32)
    first = lo.to(torch.int64)
    flip = reverse[:, None]
    first = torch.where(flip, first.flip(1), first)
    fixed = torch.where(flip[..., None], fixed.flip(1), fixed)
    return first, fixed


def _clip8(acc):
    import torch

    return torch.clamp(torch.div(acc, 1 << _WEIGHT_BITS, rounding_mode="floor"), 0, 255)


def resized_crop(images: Sequence[Any], crops, mode: str, size: int):
    """The CPU path's output for each image: ``images`` are uint8 [3, H, W] tensors (RGB, full
    resolution) on one device, ``crops`` float64 [n, 8] "<field>.crop" rows on that device,
    ``mode`` "random_resized_crop" (crop, then resize: the filter clamps at the crop) or
    "center_crop" (resize, then crop: it clamps at the image). Returns uint8 [n, size, size, 3]."""
    import torch

    device = crops.device
    n = len(images)
    if n == 0:
        return torch.empty((0, size, size, 3), dtype=torch.uint8, device=device)
    width, height = crops[:, WIDTH], crops[:, HEIGHT]
    if mode == "random_resized_crop":  # the domain is the crop itself, whole pixels
        dom_x0, dom_y0 = crops[:, X0], crops[:, Y0]
        dom_w, dom_h = crops[:, X1] - crops[:, X0], crops[:, Y1] - crops[:, Y0]
    else:
        dom_x0, dom_y0 = torch.zeros_like(width), torch.zeros_like(height)
        dom_w, dom_h = width, height
    flip = crops[:, FLIP] != 0
    first_h, w_h = axis_taps(crops[:, X0] - dom_x0, crops[:, X1] - dom_x0, dom_w, size, flip)
    first_v, w_v = axis_taps(crops[:, Y0] - dom_y0, crops[:, Y1] - dom_y0, dom_h, size,
                             torch.zeros_like(flip))

    # Every image, flattened into one buffer: sample i's pixel (c, y, x) is at
    # base[i] + (c * H + y) * W + x.
    flat = torch.cat([img.reshape(-1) for img in images])
    pixels = (width * height).to(torch.int64)
    base = torch.cumsum(pixels * 3, 0) - pixels * 3
    w_i, h_i = width.to(torch.int64), height.to(torch.int64)
    dx0, dy0 = dom_x0.to(torch.int64), dom_y0.to(torch.int64)
    dw, dh = dom_w.to(torch.int64), dom_h.to(torch.int64)

    # Horizontal pass over the rows the vertical taps read, relative to the first of them.
    row0 = first_v.min(dim=1).values
    row_end = (first_v + w_v.shape[2]).max(dim=1).values
    rows = int((row_end - row0).max().item())
    r = torch.arange(rows, device=device)
    src_row = dy0[:, None] + torch.minimum(row0[:, None] + r[None, :], dh[:, None] - 1)  # [n, R]
    c = torch.arange(3, device=device)
    row_base = (base[:, None, None] + (c[None, :, None] * h_i[:, None, None]
                                       + src_row[:, None, :]) * w_i[:, None, None])  # [n, 3, R]
    acc = torch.full((n, 3, rows, size), 1 << (_WEIGHT_BITS - 1), dtype=torch.int32,
                     device=device)
    for k in range(w_h.shape[2]):
        col = dx0[:, None] + torch.clamp(first_h + k, max=dw[:, None] - 1)  # [n, size]
        index = row_base[..., None] + col[:, None, None, :]
        acc += flat.take(index).to(torch.int32) * w_h[:, None, None, :, k]
    horizontal = _clip8(acc)  # 8-bit rows, as the CPU pass stores them

    acc = torch.full((n, 3, size, size), 1 << (_WEIGHT_BITS - 1), dtype=torch.int32,
                     device=device)
    for k in range(w_v.shape[2]):
        row = torch.clamp(first_v - row0[:, None] + k, 0, rows - 1)  # [n, size]
        picked = torch.gather(horizontal, 2,
                              row[:, None, :, None].expand(n, 3, size, size))
        acc += picked * w_v[:, None, :, k, None]
    return _clip8(acc).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


# ---- The stage the Loader runs ----------------------------------------------------------------

def device_fields(decode: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """{field: DeviceImageTransform} from a Loader's ``decode`` argument."""
    return {name: spec for name, spec in (decode or {}).items()
            if isinstance(spec, _core.DeviceImageTransform)}


def torchvision_decoder() -> Tuple[Optional[Decoder], str]:
    """torchvision's batched GPU decode, or None and why it is not there."""
    try:
        import torchvision.io as tvio
    except Exception as e:  # noqa: BLE001 - any import failure means: not available
        return None, f"torchvision does not import ({type(e).__name__}: {e})"
    if not hasattr(tvio, "decode_jpeg") or not hasattr(tvio, "ImageReadMode"):
        return None, "torchvision.io has no decode_jpeg"

    def decode(jpegs: List[Any], device: Any) -> List[Any]:
        return list(tvio.decode_jpeg(jpegs, mode=tvio.ImageReadMode.RGB, device=device))

    return decode, ""


def probe_decoder(decode: Decoder, device: Any) -> str:
    """Decodes one small JPEG on ``device``: "" when that works, else why (a torchvision built
    without nvJPEG fails on every batch, and every sample would be reported corrupt). Also pays
    nvJPEG's first-call setup here rather than in the first batch."""
    import io

    import torch
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 30, 90)).save(out, format="JPEG")
    jpeg = torch.frombuffer(bytearray(out.getvalue()), dtype=torch.uint8)
    try:
        images = decode([jpeg], device)
    except Exception as e:  # noqa: BLE001 - any failure means the GPU decode is not usable
        return f"torchvision's GPU decode_jpeg failed on a 32x24 test image ({e})"
    if len(images) != 1 or tuple(images[0].shape) != (3, 24, 32):
        return (f"torchvision's GPU decode_jpeg gave {[tuple(i.shape) for i in images]} for a "
                "32x24 test image")
    return ""


def stage_device(loader_device: str, fields: Dict[str, Any]):
    """The torch device the fields are decoded on: the Loader's CUDA device, with its index.
    ValueError naming the field when the loader's device is not CUDA, torch has no CUDA device,
    or a transform names another device."""
    import torch

    for name, spec in fields.items():
        if not loader_device.startswith("cuda"):
            raise ValueError(f"decode[{name!r}] = {spec!r} decodes on the GPU: it needs "
                             f"Loader(device='cuda'), not device={loader_device!r} (or "
                             "leave the transform's device at 'cpu')")
    if not torch.cuda.is_available():
        raise ValueError(f"decode[{next(iter(fields))!r}] asks for GPU decode but torch.cuda is "
                         f"not available (torch {torch.__version__}, CUDA {torch.version.cuda})")
    device = torch.device(loader_device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for name, spec in fields.items():
        wanted = torch.device(spec.device)
        if wanted.type != "cuda" or (wanted.index is not None and wanted.index != device.index):
            raise ValueError(f"decode[{name!r}] = {spec!r} names another device than the "
                             f"Loader's {str(device)!r}")
    return device


class GpuDecode:
    """Decodes a Loader's GPU image fields, batch by batch: ``stage(arrays)`` replaces each
    field's bytes, offsets and crop columns with a uint8 [n, size, size, 3] tensor on the device
    and returns the batch without the samples whose decode failed, with (global index, reason)
    for each of those (the Loader applies ``on_corrupt``). Without torchvision's GPU decode the
    fields are decoded on the CPU threads instead: said once, and ``stats()["fallback"]`` says
    why. Not thread-safe: one caller (the Loader's next())."""

    def __init__(self, fields: Dict[str, Any], loader_device: str,
                 decoder: Optional[Decoder] = None, max_pending: int = 4) -> None:
        self.fields = fields
        self.device = stage_device(loader_device, fields)
        self.fallback = ""
        if decoder is None:
            decoder, self.fallback = torchvision_decoder()
            if decoder is not None:
                self.fallback = probe_decoder(decoder, self.device)
        self._decode = decoder
        self._cuda = self.device.type == "cuda"
        self._stream = None
        if self._cuda and not self.fallback:
            import torch

            self._stream = torch.cuda.Stream(device=self.device)
        # (event, host arrays) for batches whose device work may still read them.
        self._pending: List[Tuple[Any, Any]] = []
        self._max_pending = max(1, max_pending)
        self._stats = dict(batches=0, jpegs_decoded_on_gpu=0, images_decoded_on_cpu=0,
                           failed=0, stage_s=0.0)
        if self.fallback:
            _warn_fallback_once(self.fallback)

    def core_decode(self, decode: Dict[str, Any]) -> Dict[str, Any]:
        """The ``decode`` the C++ loader gets: the fields as they are, or, in fallback, as the
        CPU transform they wrap."""
        if not self.fallback:
            return decode
        return {name: (spec.transform if name in self.fields else spec)
                for name, spec in decode.items()}

    def stats(self) -> Dict[str, Any]:
        return dict(self._stats, fields=sorted(self.fields), device=str(self.device),
                    fallback=self.fallback or None)

    def __call__(self, arrays: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Tuple[int, str]]]:
        if self.fallback:
            return arrays, []
        import torch

        started = time.perf_counter()
        failed: Dict[int, str] = {}
        outputs: Dict[str, Any] = {}
        host: List[Any] = []
        stream = torch.cuda.stream(self._stream) if self._stream is not None else _no_stream()
        with stream:
            for name, spec in self.fields.items():
                data = arrays.pop(name)
                offsets = arrays.pop(name + ".offsets")
                crops = arrays.pop(name + ".crop")
                host.extend((data, offsets, crops))
                outputs[name] = self._decode_field(name, spec.transform, data, offsets, crops,
                                                   failed)
            event = None
            if self._stream is not None:
                event = torch.cuda.Event()
                event.record(self._stream)
        if event is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(event)
            for tensor in outputs.values():
                tensor.record_stream(consumer)
            self._hold(event, host)
        keep = [row for row in range(len(arrays["__index__"])) if row not in failed]
        if failed:
            index = arrays["__index__"]
            reasons = [(int(index[row]), failed[row]) for row in sorted(failed)]
            arrays = drop_rows(arrays, sorted(failed))
            outputs = {name: out[torch.as_tensor(keep, device=out.device)]
                       for name, out in outputs.items()}
        else:
            reasons = []
        arrays.update(outputs)
        self._stats["batches"] += 1
        self._stats["failed"] += len(reasons)
        self._stats["stage_s"] += time.perf_counter() - started
        return arrays, reasons

    def _decode_field(self, name: str, transform: Any, data: np.ndarray, offsets: np.ndarray,
                      crops: np.ndarray, failed: Dict[int, str]):
        import torch

        n, size = len(offsets) - 1, transform.size
        out = torch.empty((n, size, size, 3), dtype=torch.uint8, device=self.device)
        decoded_here = crops[:, DECODED] != 0
        jpeg_rows = [int(r) for r in np.flatnonzero(~decoded_here)]
        if jpeg_rows:
            host = torch.from_numpy(data)
            jpegs = [host[int(offsets[r]):int(offsets[r + 1])] for r in jpeg_rows]
            images = self._decode_rows(name, jpegs, jpeg_rows, crops, failed)
            good = [i for i, r in enumerate(jpeg_rows) if r not in failed]
            if good:
                rows = [jpeg_rows[i] for i in good]
                crop_rows = torch.from_numpy(np.ascontiguousarray(crops[rows])).to(self.device)
                out[torch.as_tensor(rows, device=self.device)] = resized_crop(
                    [images[i] for i in good], crop_rows, transform.mode, size)
            self._stats["jpegs_decoded_on_gpu"] += len(good)
        cpu_rows = [int(r) for r in np.flatnonzero(decoded_here)]
        if cpu_rows:
            # Copied out of the arena first, so the (rare) rows' transfer never reads the arena.
            pixels = np.stack([data[offsets[r]:offsets[r + 1]] for r in cpu_rows])
            out[torch.as_tensor(cpu_rows, device=self.device)] = torch.from_numpy(
                pixels.reshape(len(cpu_rows), size, size, 3)).to(self.device)
            self._stats["images_decoded_on_cpu"] += len(cpu_rows)
        return out

    def _decode_rows(self, name: str, jpegs: List[Any], rows: List[int], crops: np.ndarray,
                     failed: Dict[int, str]) -> List[Any]:
        """Decodes the batch in one call; when that fails, image by image, so that only the
        images that fail are lost. Each image's size is checked against its header's."""
        try:
            images = self._decode(jpegs, self.device)
        except Exception:  # noqa: BLE001 - find the culprits one by one below
            images = []
            for jpeg, row in zip(jpegs, rows):
                try:
                    images.append(self._decode([jpeg], self.device)[0])
                except Exception as e:  # noqa: BLE001 - a bad image is a corrupt sample
                    failed[row] = f"field '{name}' GPU JPEG decode failed: {e}"
                    images.append(None)
        for image, row in zip(images, rows):
            if image is None:
                continue
            expected = (3, int(crops[row, HEIGHT]), int(crops[row, WIDTH]))
            if tuple(image.shape) != expected:
                failed[row] = (f"field '{name}' GPU JPEG decode gave shape {tuple(image.shape)}, "
                               f"the header says {expected}")
        return images

    def _hold(self, event: Any, host: List[Any]) -> None:
        """Keeps a batch's host arrays (views of its pinned arena) until its device work is done;
        past max_pending batches, waits for the oldest, at most EVENT_TIMEOUT_S."""
        self._pending.append((event, host))
        self._pending = [(e, h) for e, h in self._pending if not e.query()]
        while len(self._pending) > self._max_pending:
            wait_event(self._pending.pop(0)[0], "GPU JPEG decode of an earlier batch")


def wait_event(event: Any, what: str, timeout_s: float = EVENT_TIMEOUT_S) -> None:
    """Waits for a CUDA event, polling, at most ``timeout_s``: TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    pause = 1e-5
    while not event.query():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not finished on the device after {timeout_s:.0f} s")
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


class _no_stream:  # noqa: N801 - stands in for torch.cuda.stream() off the GPU
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _warn_fallback_once(reason: str) -> None:
    with _warn_lock:
        if reason in _warned_fallback:
            return
        _warned_fallback.add(reason)
    warnings.warn(f"zerowait: GPU JPEG decode is not available ({reason}); the loader decodes "
                  "these fields on its CPU threads instead", RuntimeWarning, stacklevel=3)
