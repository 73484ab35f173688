"""Audio clips through the Loader: WAV files of any length become float32 [n, channels, length]
rows (centre or seeded random windows, zero padding, lengths beside them), with the same
windows after an exact resume; files that are not audio, or at another rate, are corrupt."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
import torch

import zerowait
from helpers import batches_and_errors

RATE = 16_000


def wav(samples: np.ndarray, rate: int = RATE) -> bytes:
    """A 16-bit PCM WAV of int16 samples [frames] or [frames, channels]."""
    frames = samples.reshape(len(samples), -1)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames.astype("<i2").tobytes())
    return out.getvalue()


def ramp(frames: int, start: int = 0) -> np.ndarray:
    return ((np.arange(frames) + start) % 30000).astype(np.int16)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """24 mono clips of 200 to 2,500 frames, each a ramp starting at 1000 x its number."""
    lengths = [200 + 100 * i for i in range(24)]
    rows = [{"wav": wav(ramp(n, 1000 * i)), "cls": i} for i, n in enumerate(lengths)]
    path = tmp_path_factory.mktemp("audio") / "ds"
    zerowait.write_dataset(rows, path, shard_size=16 << 10)
    return path, lengths


def all_rows(loader):
    rows = {}
    for batch in loader:
        for i, index in enumerate(batch["__index__"].tolist()):
            rows[index] = (batch["wav"][i].clone(), int(batch["wav.lengths"][i]))
    return rows


def test_clips_are_centred_or_padded_to_the_length(clips):
    path, lengths = clips
    with zerowait.Loader(path, 5, decode={"wav": zerowait.AudioClip(1000)}) as loader:
        rows = all_rows(loader)
    assert len(rows) == 24
    for index, (row, taken) in rows.items():
        assert row.shape == (1, 1000) and row.dtype == torch.float32
        frames = lengths[index]
        assert taken == min(frames, 1000)
        source = ramp(frames, 1000 * index).astype(np.float32) / 32768
        first = (frames - 1000) // 2 if frames > 1000 else 0
        np.testing.assert_allclose(row[0, :taken].numpy(), source[first:first + taken])
        assert not row[0, taken:].any()


def test_random_windows_repeat_after_a_resume_and_change_with_the_epoch(clips):
    path, lengths = clips
    clip = zerowait.AudioClip(300, random_crop=True)
    with zerowait.Loader(path, 4, seed=9, decode={"wav": clip}) as loader:
        whole = all_rows(loader)
        next_epoch = all_rows(loader)
    with zerowait.Loader(path, 4, seed=9, decode={"wav": clip}) as loader:
        first = {}
        for _ in range(2):
            batch = loader.next()
            first.update({int(i): batch["wav"][k].clone()
                          for k, i in enumerate(batch["__index__"].tolist())})
        state = loader.state_dict()
    with zerowait.Loader(path, 4, seed=9, decode={"wav": clip}) as loader:
        loader.load_state_dict(state)
        rest = all_rows(loader)
    for index, row in first.items():
        assert torch.equal(row, whole[index][0])
    for index, (row, _) in rest.items():
        assert torch.equal(row, whole[index][0])
    assert len(first) + len(rest) == 24
    long_clips = [i for i, n in enumerate(lengths) if n > 600]
    assert any(not torch.equal(whole[i][0], next_epoch[i][0]) for i in long_clips)
    for index in long_clips:  # every window is a contiguous slice of its ramp
        row = (whole[index][0][0].numpy() * 32768).round()
        assert np.all(np.diff(row) % 30000 == 1)


def test_stereo_is_averaged_to_mono_or_kept(tmp_path):
    left, right = ramp(500), (ramp(500) // 2).astype(np.int16)
    path = tmp_path / "ds"
    zerowait.write_dataset([{"wav": wav(np.stack([left, right], axis=1))}], path)
    with zerowait.Loader(path, 1, decode={"wav": zerowait.AudioClip(500, channels=2)}) as loader:
        row = loader.next()["wav"][0]
    np.testing.assert_allclose(row[0].numpy(), left / 32768)
    np.testing.assert_allclose(row[1].numpy(), right / 32768)
    with zerowait.Loader(path, 1, decode={"wav": zerowait.AudioClip(500)}) as loader:
        mono = loader.next()["wav"][0]
    np.testing.assert_allclose(mono[0].numpy(), (left / 32768 + right / 32768) / 2, atol=1e-6)


def test_files_that_are_not_audio_or_at_another_rate_are_corrupt_samples(tmp_path):
    rows = [{"__key__": "good", "wav": wav(ramp(100))},
            {"__key__": "text", "wav": b"this is not a wav file at all"},
            {"__key__": "fast", "wav": wav(ramp(100), rate=44_100)},
            {"__key__": "cut", "wav": wav(ramp(1000))[:700]}]
    path = tmp_path / "ds"
    zerowait.write_dataset(rows, path)
    clip = zerowait.AudioClip(100, sample_rate=RATE)
    with zerowait.Loader(path, 4, shuffle="none", decode={"wav": clip}) as loader:
        batches, raised = batches_and_errors(loader, zerowait.CorruptDataError)
    errors = [str(e) for e in raised]
    assert [b["__index__"].tolist() for b in batches] == [[0]]
    assert any("'text'" in e and "not audio libsndfile can read" in e for e in errors)
    assert any("'fast'" in e and "44100 Hz, not 16000 Hz" in e for e in errors)
    assert any("'cut'" in e and "ends after" in e for e in errors)
    with pytest.raises(zerowait.InvalidArgumentError, match="length"):
        zerowait.AudioClip(0)
