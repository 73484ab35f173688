// Audio clips for speech and sound models: a field that holds an audio file (WAV, FLAC, Ogg/Vorbis:
// whatever libsndfile reads) becomes one fixed-length float32 row of a [batch, channels, length]
// tensor, the waveform torchaudio.load would give for the same frames.
//
// Shorter clips are padded with zeros (the "<field>.lengths" column gives the real frame count);
// longer ones are cut to `length` frames, centred or, with `random_crop`, at an offset drawn from
// (seed, epoch, sample index) like an image crop, so an exact resume sees the same windows. Only
// the window's frames are decoded: a minute-long file costs what its one-second window costs.
// There is no resampling: a file at another rate than `sample_rate` is an error, not a surprise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "zerowait/common/status.hpp"

namespace zerowait {

struct AudioClip {
  uint32_t length = 0;       // frames per row, > 0 (e.g. 16000 for one second at 16 kHz)
  uint32_t channels = 1;     // output channels: 1 = mono, a file with more channels is averaged
                             // down to it; otherwise the file must have exactly this many
  uint32_t sample_rate = 0;  // 0: any; otherwise a file at another rate is kCorrupt (no resampling)
  bool random_crop = false;  // longer clips: a window at an offset drawn from `seed`; else centred

  // kInvalidArgument naming the bad field (length 0 or over 2^26, channels 0 or over 64).
  Status validate() const;
  size_t row_bytes() const { return size_t(length) * channels * sizeof(float); }

  // Decodes the audio file in `bytes` (read from memory through sf_open_virtual) into `out`,
  // row_bytes() of float32 [channels, length], planar (channel-major): integer PCM scaled to
  // [-1, 1) as libsndfile gives it, float files as stored; a shorter clip is padded with zeros
  // after its end. Returns the frames of real audio written (<= length).
  //
  // kCorrupt, its message phrased to follow "field 'x' ", when `bytes` is not audio libsndfile
  // can read, has another channel count or sample rate than asked, or ends before its header says;
  // kUnsupported for files of over 64 channels or 2^31 frames. On every error `out` is still fully
  // written (decoded frames, zeros elsewhere). Thread-safe: any number of threads may decode at
  // once.
  Result<uint64_t> decode(std::span<const std::byte> bytes, uint64_t seed, float* out) const;
};

}  // namespace zerowait
