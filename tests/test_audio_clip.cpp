// Audio clips from real WAV, FLAC and Ogg/Vorbis files written here with libsndfile: padding,
// centred and random windows cut from the right frames, downmixing, and files with the wrong
// channel count or rate, garbage and truncated files failing cleanly with the row fully written.
#include <gtest/gtest.h>
#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/random.hpp"
#include "testing/testing.hpp"
#include "zerowait/loader/audio_clip.hpp"

namespace zerowait {
namespace {

using Bytes = std::vector<std::byte>;

// What decode() must overwrite: any value left in a row shows up as a NaN.
constexpr float kUnwritten = NAN;

// An in-memory file that libsndfile writes into (it seeks back to finish the header).
struct GrowingFile {
  Bytes bytes;
  sf_count_t pos = 0;
};

SF_VIRTUAL_IO growing_io() {
  SF_VIRTUAL_IO io{};
  io.get_filelen = [](void* user) {
    return sf_count_t(static_cast<GrowingFile*>(user)->bytes.size());
  };
  io.seek = [](sf_count_t offset, int whence, void* user) {
    auto* file = static_cast<GrowingFile*>(user);
    const sf_count_t base = whence == SEEK_SET   ? 0
                            : whence == SEEK_CUR ? file->pos
                                                 : sf_count_t(file->bytes.size());
    file->pos = base + offset;
    return file->pos;
  };
  io.read = [](void* dst, sf_count_t count, void* user) {
    auto* file = static_cast<GrowingFile*>(user);
    const sf_count_t n = std::max<sf_count_t>(
        0, std::min<sf_count_t>(count, sf_count_t(file->bytes.size()) - file->pos));
    if (n > 0) std::memcpy(dst, file->bytes.data() + file->pos, size_t(n));
    file->pos += n;
    return n;
  };
  io.write = [](const void* src, sf_count_t count, void* user) {
    auto* file = static_cast<GrowingFile*>(user);
    const auto end = size_t(file->pos + count);
    if (file->bytes.size() < end) file->bytes.resize(end);
    std::memcpy(file->bytes.data() + file->pos, src, size_t(count));
    file->pos += count;
    return count;
  };
  io.tell = [](void* user) { return static_cast<GrowingFile*>(user)->pos; };
  return io;
}

// An audio file of `format` (SF_FORMAT_WAV | SF_FORMAT_PCM_16, ...) holding `samples`,
// interleaved, `channels` per frame. int16 samples are written as they are, so a PCM file holds
// exactly them; float samples suit FLOAT files and lossy codecs.
template <typename Sample>
Bytes encode(const std::vector<Sample>& samples, int channels, int rate, int format) {
  GrowingFile file;
  SF_VIRTUAL_IO io = growing_io();
  SF_INFO info{};
  info.channels = channels;
  info.samplerate = rate;
  info.format = format;
  SNDFILE* sf = sf_open_virtual(&io, SFM_WRITE, &info, &file);
  EXPECT_NE(sf, nullptr) << sf_strerror(nullptr);
  if (sf == nullptr) return {};
  const sf_count_t frames = sf_count_t(samples.size()) / channels;
  if constexpr (std::is_same_v<Sample, int16_t>) {
    EXPECT_EQ(sf_writef_short(sf, samples.data(), frames), frames);
  } else {
    EXPECT_EQ(sf_writef_float(sf, samples.data(), frames), frames);
  }
  EXPECT_EQ(sf_close(sf), 0);
  return file.bytes;
}

// 0, 1, 2, ... as int16 samples of one channel: a window's first value says where it starts.
std::vector<int16_t> ramp(int frames) {
  std::vector<int16_t> samples(size_t(frames), 0);
  for (int i = 0; i < frames; ++i) samples[size_t(i)] = int16_t(i);
  return samples;
}

float pcm16(int value) { return float(value) / 32768.0f; }

struct Decoded {
  Result<uint64_t> result = uint64_t(0);
  std::vector<float> row;
};

Decoded decode(const AudioClip& clip, const Bytes& bytes, uint64_t seed = 0) {
  EXPECT_TRUE(clip.validate().is_ok()) << clip.validate().to_string();
  Decoded d;
  d.row.assign(clip.row_bytes() / sizeof(float), kUnwritten);
  d.result = clip.decode(bytes, seed, d.row.data());
  return d;
}

// Every value from `from` on, in each channel of the row, is a written zero.
void expect_zeros_from(const AudioClip& clip, const std::vector<float>& row, uint64_t from) {
  for (uint32_t c = 0; c < clip.channels; ++c) {
    for (uint64_t i = from; i < clip.length; ++i) {
      ASSERT_EQ(row[c * clip.length + i], 0.0f) << "channel " << c << ", frame " << i;
    }
  }
}

TEST(AudioClip, ShorterMonoWavIsPaddedWithZeros) {
  const std::vector<int16_t> samples = {0, 1000, -32768, 32767, 16384, -1};
  const AudioClip clip{.length = 10, .channels = 1};
  const Decoded d = decode(clip, encode(samples, 1, 16000, SF_FORMAT_WAV | SF_FORMAT_PCM_16));
  ASSERT_TRUE(d.result.is_ok()) << d.result.status().to_string();
  EXPECT_EQ(*d.result, samples.size());
  for (size_t i = 0; i < samples.size(); ++i) EXPECT_FLOAT_EQ(d.row[i], pcm16(samples[i])) << i;
  expect_zeros_from(clip, d.row, samples.size());
}

TEST(AudioClip, LongerStereoFlacGivesItsCentreWindowPlanarOrAveraged) {
  constexpr int kFrames = 1000;
  std::vector<int16_t> samples;
  for (int i = 0; i < kFrames; ++i) {
    samples.push_back(int16_t(i));       // left
    samples.push_back(int16_t(-2 * i));  // right
  }
  const Bytes flac = encode(samples, 2, 16000, SF_FORMAT_FLAC | SF_FORMAT_PCM_16);
  const AudioClip stereo{.length = 100, .channels = 2, .sample_rate = 16000};
  const Decoded d = decode(stereo, flac);
  ASSERT_TRUE(d.result.is_ok()) << d.result.status().to_string();
  EXPECT_EQ(*d.result, 100u);
  constexpr int kFirst = (kFrames - 100) / 2;
  for (int j = 0; j < 100; ++j) {
    ASSERT_FLOAT_EQ(d.row[j], pcm16(kFirst + j)) << j;
    ASSERT_FLOAT_EQ(d.row[100 + j], pcm16(-2 * (kFirst + j))) << j;
  }

  const AudioClip mono{.length = 100, .channels = 1};
  const Decoded m = decode(mono, flac);
  ASSERT_TRUE(m.result.is_ok()) << m.result.status().to_string();
  EXPECT_EQ(*m.result, 100u);
  for (int j = 0; j < 100; ++j) {
    ASSERT_FLOAT_EQ(m.row[j], (pcm16(kFirst + j) + pcm16(-2 * (kFirst + j))) / 2) << j;
  }
}

TEST(AudioClip, RandomCropsAreSeededContiguousSlices) {
  constexpr int kFrames = 20000;
  std::vector<float> samples(kFrames);
  for (int i = 0; i < kFrames; ++i) samples[size_t(i)] = float(i) / 65536.0f;
  const Bytes wav = encode(samples, 1, 8000, SF_FORMAT_WAV | SF_FORMAT_FLOAT);
  const AudioClip clip{.length = 64, .random_crop = true};
  std::set<uint64_t> offsets;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    const Decoded d = decode(clip, wav, seed);
    ASSERT_TRUE(d.result.is_ok()) << d.result.status().to_string();
    ASSERT_EQ(*d.result, 64u);
    const auto first = uint64_t(d.row[0] * 65536.0f);
    EXPECT_EQ(first, internal::mix64(seed) % (kFrames - 64 + 1)) << "seed " << seed;
    for (int j = 0; j < 64; ++j) ASSERT_EQ(d.row[j], float(first + j) / 65536.0f) << j;
    EXPECT_EQ(decode(clip, wav, seed).row, d.row) << "seed " << seed << " again";
    offsets.insert(first);
  }
  EXPECT_GE(offsets.size(), 2u);

  // An int16 ramp in a FLAC: the same through another codec's seek.
  const Bytes flac = encode(ramp(kFrames), 1, 8000, SF_FORMAT_FLAC | SF_FORMAT_PCM_16);
  for (uint64_t seed : {3u, 99u}) {
    const Decoded d = decode(clip, flac, seed);
    ASSERT_TRUE(d.result.is_ok()) << d.result.status().to_string();
    const uint64_t first = internal::mix64(seed) % (kFrames - 64 + 1);
    for (int j = 0; j < 64; ++j) ASSERT_EQ(d.row[j], pcm16(int(first) + j)) << j;
  }
}

TEST(AudioClip, OggVorbisDecodesToItsLength) {
  constexpr int kFrames = 4000;
  std::vector<float> samples(kFrames);
  for (int i = 0; i < kFrames; ++i) samples[size_t(i)] = 0.5f * std::sin(float(i) * 0.05f);
  const Bytes ogg = encode(samples, 1, 16000, SF_FORMAT_OGG | SF_FORMAT_VORBIS);
  const AudioClip clip{.length = 5000, .sample_rate = 16000};
  const Decoded d = decode(clip, ogg);
  ASSERT_TRUE(d.result.is_ok()) << d.result.status().to_string();
  EXPECT_EQ(*d.result, uint64_t(kFrames));
  double error = 0;  // lossy: close, not equal
  for (int i = 0; i < kFrames; ++i) error += std::abs(d.row[size_t(i)] - samples[size_t(i)]);
  EXPECT_LT(error / kFrames, 0.02);
  expect_zeros_from(clip, d.row, kFrames);
}

TEST(AudioClip, WrongSampleRateOrChannelCountIsCorrupt) {
  const Bytes stereo = encode(std::vector<int16_t>(200, 7), 2, 44100,
                              SF_FORMAT_WAV | SF_FORMAT_PCM_16);
  Decoded d = decode(AudioClip{.length = 50, .channels = 2, .sample_rate = 16000}, stereo);
  ASSERT_EQ(d.result.status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(d.result.status().message(), "has a sample rate of 44100 Hz, not 16000 Hz");
  expect_zeros_from(AudioClip{.length = 50, .channels = 2}, d.row, 0);

  d = decode(AudioClip{.length = 50, .channels = 3}, stereo);
  ASSERT_EQ(d.result.status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(d.result.status().message(), "has 2 channels, not 3");
  expect_zeros_from(AudioClip{.length = 50, .channels = 3}, d.row, 0);

  const Bytes mono =
      encode(std::vector<int16_t>(100, 7), 1, 16000, SF_FORMAT_FLAC | SF_FORMAT_PCM_16);
  d = decode(AudioClip{.length = 50, .channels = 2}, mono);
  ASSERT_EQ(d.result.status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(d.result.status().message(), "has 1 channel, not 2");
}

TEST(AudioClip, GarbageAndEmptyBytesAreCorruptWithAZeroRow) {
  const AudioClip clip{.length = 32, .channels = 2};
  for (const Bytes& bytes : {testing::to_bytes(testing::random_bytes(4096, 1)), Bytes{},
                             testing::to_bytes(std::string("RIFF\x24\0\0\0WAVEfmt ", 16))}) {
    const Decoded d = decode(clip, bytes);
    ASSERT_EQ(d.result.status().code(), ErrorCode::kCorrupt) << bytes.size() << " bytes";
    EXPECT_EQ(d.result.status().message().rfind("is not audio libsndfile can read (", 0), 0u)
        << d.result.status().message();
    expect_zeros_from(clip, d.row, 0);
  }
}

TEST(AudioClip, TruncatedFilesAreCorruptAndKeepWhatTheyHold) {
  constexpr int kFrames = 1000;
  const Bytes wav = encode(ramp(kFrames), 1, 16000, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
  ASSERT_EQ(wav.size(), 44u + 2 * kFrames);  // the canonical header, then the samples
  const Bytes cut(wav.begin(), wav.begin() + 44 + 2 * 400 + 1);  // mid-sample after 400 frames

  // A row longer than the file: the 400 frames there, zeros after.
  const AudioClip whole{.length = 1200};
  Decoded d = decode(whole, cut);
  ASSERT_EQ(d.result.status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(d.result.status().message(), "ends after 400 of 1000 frames");
  for (int i = 0; i < 400; ++i) ASSERT_EQ(d.row[size_t(i)], pcm16(i)) << i;
  expect_zeros_from(whole, d.row, 400);

  // A centred window past the end, and a random one inside what is there: the same error.
  const AudioClip centred{.length = 100};
  d = decode(centred, cut);
  ASSERT_EQ(d.result.status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(d.result.status().message(), "ends after 400 of 1000 frames");
  expect_zeros_from(centred, d.row, 0);
  const AudioClip random{.length = 100, .random_crop = true};
  uint64_t seed = 0;
  while (internal::mix64(seed) % (kFrames - 100 + 1) > 300) ++seed;
  d = decode(random, cut, seed);
  ASSERT_EQ(d.result.status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(d.result.status().message(), "ends after 400 of 1000 frames");
  const uint64_t first = internal::mix64(seed) % (kFrames - 100 + 1);
  for (int j = 0; j < 100; ++j) ASSERT_EQ(d.row[size_t(j)], pcm16(int(first) + j)) << j;

  // A FLAC cut in half (five blocks of 4096 frames, so some come whole): its header's count is
  // the whole file's, and the frames before the cut are kept.
  const Bytes flac = encode(ramp(20000), 1, 16000, SF_FORMAT_FLAC | SF_FORMAT_PCM_16);
  const Bytes half(flac.begin(), flac.begin() + long(flac.size() / 2));
  const AudioClip longer{.length = 25000};
  d = decode(longer, half);
  ASSERT_EQ(d.result.status().code(), ErrorCode::kCorrupt);
  const std::string message = d.result.status().message();
  size_t held = 0;
  ASSERT_EQ(std::sscanf(message.c_str(), "ends after %zu of 20000 frames", &held), 1) << message;
  EXPECT_GT(held, 0u) << message;
  EXPECT_LT(held, 20000u) << message;
  for (size_t i = 0; i < held; ++i) ASSERT_EQ(d.row[i], pcm16(int(i))) << i;
  expect_zeros_from(longer, d.row, held);
}

TEST(AudioClip, ThreadsDecodingAtOnceGetTheSameRows) {
  std::vector<int16_t> samples;
  for (int i = 0; i < 30000; ++i) samples.push_back(int16_t((i * 7919) % 20000 - 10000));
  const Bytes flac = encode(samples, 2, 16000, SF_FORMAT_FLAC | SF_FORMAT_PCM_16);
  const Bytes garbage = testing::to_bytes(testing::random_bytes(512, 9));
  const AudioClip clip{.length = 4000, .channels = 1, .random_crop = true};
  std::vector<std::vector<float>> expected;
  for (uint64_t seed = 0; seed < 8; ++seed) expected.push_back(decode(clip, flac, seed).row);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> row(clip.length);
      for (int round = 0; round < 40; ++round) {
        const uint64_t seed = uint64_t(t + round) % 8;
        const Result<uint64_t> r = clip.decode(flac, seed, row.data());
        if (!r.is_ok() || row != expected[seed]) ++mismatches[size_t(t)];
        // Failing opens interleaved with good ones: their messages must stay their own.
        const Result<uint64_t> bad = clip.decode(garbage, seed, row.data());
        if (bad.status().message().rfind("is not audio libsndfile can read (", 0) != 0) {
          ++mismatches[size_t(t)];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(mismatches[size_t(t)], 0) << "thread " << t;
}

TEST(AudioClip, ValidateNamesTheBadField) {
  EXPECT_TRUE(AudioClip{.length = 16000}.validate().is_ok());
  const Status no_length = AudioClip{.length = 0}.validate();
  EXPECT_EQ(no_length.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(no_length.message().find("length"), std::string::npos) << no_length.message();
  EXPECT_EQ(AudioClip{.length = (1u << 26) + 1}.validate().code(), ErrorCode::kInvalidArgument);
  const AudioClip none{.length = 16000, .channels = 0};
  const Status no_channels = none.validate();
  EXPECT_EQ(no_channels.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(no_channels.message().find("channels"), std::string::npos) << no_channels.message();
  const AudioClip too_many{.length = 16000, .channels = 65};
  EXPECT_EQ(too_many.validate().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerowait
