#include "zerowait/loader/audio_clip.hpp"

#include <sndfile.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/random.hpp"

namespace zerowait {

namespace {

// Over an hour at 16 kHz: longer than any clip a model trains on.
constexpr uint32_t kMaxLength = 1u << 26;
// More than any microphone array or ambisonic order in use; bounds the scratch buffer.
constexpr int kMaxChannels = 64;
// 12 hours at 48 kHz: a header that claims more is damaged, or a recording no sample holds whole.
constexpr sf_count_t kMaxFrames = sf_count_t(1) << 31;
// Samples per sf_readf_float call: 32 KiB of scratch whatever the file's channel count.
constexpr sf_count_t kChunkSamples = 8192;

// One file's bytes as libsndfile's virtual IO sees them: a read-only file that never grows.
struct MemoryFile {
  const std::byte* data;
  sf_count_t size;
  sf_count_t pos;
};

sf_count_t memory_length(void* user) { return static_cast<MemoryFile*>(user)->size; }

sf_count_t memory_seek(sf_count_t offset, int whence, void* user) {
  auto* file = static_cast<MemoryFile*>(user);
  sf_count_t base = 0;
  if (whence == SEEK_CUR) {
    base = file->pos;
  } else if (whence == SEEK_END) {
    base = file->size;
  } else if (whence != SEEK_SET) {
    return -1;
  }
  // Past the end is allowed, as in a file (reads there return nothing); before the start, or an
  // offset from a damaged header that overflows, is not.
  sf_count_t pos = 0;
  if (__builtin_add_overflow(base, offset, &pos) || pos < 0) return -1;
  file->pos = pos;
  return pos;
}

sf_count_t memory_read(void* dst, sf_count_t count, void* user) {
  auto* file = static_cast<MemoryFile*>(user);
  if (count <= 0 || file->pos >= file->size) return 0;
  const sf_count_t n = std::min(count, file->size - file->pos);
  std::memcpy(dst, file->data + file->pos, size_t(n));
  file->pos += n;
  return n;
}

sf_count_t memory_write(const void*, sf_count_t, void*) { return 0; }

sf_count_t memory_tell(void* user) { return static_cast<MemoryFile*>(user)->pos; }

struct SndfileCloser {
  void operator()(SNDFILE* file) const { sf_close(file); }
};
using SndfilePtr = std::unique_ptr<SNDFILE, SndfileCloser>;

// libsndfile's text for an error, without its full stop, to sit inside our parentheses.
std::string sndfile_error(const char* text) {
  std::string message = text != nullptr ? text : "unknown error";
  if (!message.empty() && message.back() == '.') message.pop_back();
  return message;
}

// Every sf_open writes libsndfile's process-wide error state (sf_errno, the parse log), and a
// failed open leaves its reason only there. Opens share this lock and run side by side (opening a
// Vorbis file costs more than decoding a second of it); one that failed runs again alone, so the
// reason read after it is its own. Two failing side by side still both write that state, which
// nobody reads then (ThreadSanitizer reports it inside libsndfile; it is harmless). Reads of an
// open file touch only that file.
std::shared_mutex open_mutex;

Result<SndfilePtr> open_memory(MemoryFile* file, SF_INFO* info) {
  SF_VIRTUAL_IO io{memory_length, memory_seek, memory_read, memory_write, memory_tell};
  {
    std::shared_lock together(open_mutex);
    if (SNDFILE* handle = sf_open_virtual(&io, SFM_READ, info, file)) return SndfilePtr(handle);
  }
  std::unique_lock alone(open_mutex);
  file->pos = 0;
  *info = SF_INFO{};
  if (SNDFILE* handle = sf_open_virtual(&io, SFM_READ, info, file)) return SndfilePtr(handle);
  return corrupt("is not audio libsndfile can read (" + sndfile_error(sf_strerror(nullptr)) +
                 ")");
}

// The frames a WAV's 'data' chunk declares, or 0 where unknown. libsndfile reports only the frames
// the bytes hold, so without this a WAV cut short would pass for a shorter clip.
sf_count_t declared_wav_frames(SNDFILE* file, const SF_INFO& info) {
  const int major = info.format & SF_FORMAT_TYPEMASK;
  if (major != SF_FORMAT_WAV && major != SF_FORMAT_WAVEX) return 0;
  sf_count_t width = 0;  // bytes per sample; compressed codecs have none
  switch (info.format & SF_FORMAT_SUBMASK) {
    case SF_FORMAT_PCM_S8:
    case SF_FORMAT_PCM_U8:
    case SF_FORMAT_ULAW:
    case SF_FORMAT_ALAW:
      width = 1;
      break;
    case SF_FORMAT_PCM_16:
      width = 2;
      break;
    case SF_FORMAT_PCM_24:
      width = 3;
      break;
    case SF_FORMAT_PCM_32:
    case SF_FORMAT_FLOAT:
      width = 4;
      break;
    case SF_FORMAT_DOUBLE:
      width = 8;
      break;
    default:
      return 0;
  }
  SF_CHUNK_INFO chunk{};
  std::memcpy(chunk.id, "data", 4);
  chunk.id_size = 4;
  const SF_CHUNK_ITERATOR* it = sf_get_chunk_iterator(file, &chunk);
  if (it == nullptr || sf_get_chunk_size(it, &chunk) != SF_ERR_NO_ERROR) return 0;
  // 0 and sizes from 0x7ffff000 up are what writers to a pipe leave (ffmpeg, sox): no length.
  if (chunk.datalen == 0 || chunk.datalen >= 0x7ffff000u) return 0;
  return sf_count_t(chunk.datalen) / (width * info.channels);
}

std::string count_of(int64_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// Writes `frames` interleaved frames of `file_channels` samples into `clip`'s planar row from
// frame `at`: channel by channel, or their mean for a mono row.
void spread(const float* src, sf_count_t frames, int file_channels, const AudioClip& clip,
            uint64_t at, float* out) {
  if (clip.channels == 1 && file_channels > 1) {
    const float scale = 1.0f / float(file_channels);
    for (sf_count_t i = 0; i < frames; ++i) {
      float sum = 0;
      for (int c = 0; c < file_channels; ++c) sum += src[i * file_channels + c];
      out[at + i] = sum * scale;
    }
    return;
  }
  for (int c = 0; c < file_channels; ++c) {
    float* dst = out + size_t(c) * clip.length + at;
    for (sf_count_t i = 0; i < frames; ++i) dst[i] = src[i * file_channels + c];
  }
}

// Decodes the window into `out`, counting in `written` the frames it holds so far on every path.
Status read_window(const AudioClip& clip, std::span<const std::byte> bytes, uint64_t seed,
                   float* out, uint64_t* written) {
  MemoryFile memory{bytes.data(), sf_count_t(bytes.size()), 0};
  SF_INFO info{};
  ZW_ASSIGN_OR_RETURN(SndfilePtr file, open_memory(&memory, &info));
  if (info.channels > kMaxChannels) {
    return unsupported("has " + std::to_string(info.channels) + " channels, more than the " +
                       std::to_string(kMaxChannels) + " supported");
  }
  if (clip.channels != 1 && uint32_t(info.channels) != clip.channels) {
    return corrupt("has " + count_of(info.channels, "channel") + ", not " +
                   std::to_string(clip.channels));
  }
  if (clip.sample_rate != 0 && uint32_t(info.samplerate) != clip.sample_rate) {
    return corrupt("has a sample rate of " + std::to_string(info.samplerate) + " Hz, not " +
                   std::to_string(clip.sample_rate) + " Hz");
  }
  if (info.frames < 0) return corrupt("has a header that gives a negative frame count");
  if (info.frames == SF_COUNT_MAX) {
    return unsupported("does not say how many frames it holds (a stream libsndfile can't measure)");
  }
  // The header's count decides the window, so a truncated file fails the same way whichever part
  // of it the window covers.
  const sf_count_t total = std::max(info.frames, declared_wav_frames(file.get(), info));
  if (total > kMaxFrames) {
    return unsupported("has " + std::to_string(total) + " frames, more than the " +
                       std::to_string(kMaxFrames) + " supported");
  }
  const auto frames = uint64_t(total);
  const uint64_t want = std::min<uint64_t>(frames, clip.length);
  uint64_t first = 0;
  if (frames > clip.length) {
    first = clip.random_crop ? internal::mix64(seed) % (frames - clip.length + 1)
                             : (frames - clip.length) / 2;
  }
  const auto ends_after = [&](uint64_t held) {
    return "ends after " + std::to_string(held) + " of " + std::to_string(frames) + " frames";
  };
  if (first > 0 && sf_seek(file.get(), sf_count_t(first), SEEK_SET) != sf_count_t(first)) {
    if (first >= uint64_t(info.frames)) return corrupt(ends_after(uint64_t(info.frames)));
    return corrupt("cannot seek to frame " + std::to_string(first) + " of " +
                   std::to_string(frames) + " (" + sndfile_error(sf_strerror(file.get())) + ")");
  }

  // Reused across calls: the only buffer a decode needs besides libsndfile's own.
  thread_local std::vector<float> scratch;
  const sf_count_t chunk = std::max<sf_count_t>(1, kChunkSamples / info.channels);
  scratch.resize(size_t(chunk) * size_t(info.channels));
  while (*written < want) {
    const sf_count_t ask = std::min<sf_count_t>(chunk, sf_count_t(want - *written));
    const sf_count_t got = std::min(ask, sf_readf_float(file.get(), scratch.data(), ask));
    if (got <= 0) break;
    spread(scratch.data(), got, info.channels, clip, *written, out);
    *written += uint64_t(got);
    if (got < ask) break;
  }
  if (*written < want) {
    // A decoder that gave up says why (a FLAC frame cut short); a WAV just ran out of bytes.
    std::string message = ends_after(first + *written);
    if (sf_error(file.get()) != SF_ERR_NO_ERROR) {
      message += " (" + sndfile_error(sf_strerror(file.get())) + ")";
    }
    return corrupt(message);
  }
  if (info.frames < total) return corrupt(ends_after(uint64_t(info.frames)));
  return Status::ok();
}

}  // namespace

Status AudioClip::validate() const {
  if (length == 0 || length > kMaxLength) {
    return invalid_argument("audio clip length must be between 1 and " +
                            std::to_string(kMaxLength) + " frames, not " + std::to_string(length));
  }
  if (channels == 0 || channels > uint32_t(kMaxChannels)) {
    return invalid_argument("audio clip channels must be between 1 and " +
                            std::to_string(kMaxChannels) + ", not " + std::to_string(channels));
  }
  return Status::ok();
}

Result<uint64_t> AudioClip::decode(std::span<const std::byte> bytes, uint64_t seed,
                                   float* out) const {
  uint64_t written = 0;
  const Status status = read_window(*this, bytes, seed, out, &written);
  // A whole row on every path: zeros after the frames decoded, in every channel.
  for (uint32_t c = 0; c < channels; ++c) {
    std::fill(out + size_t(c) * length + written, out + size_t(c + 1) * length, 0.0f);
  }
  if (!status.is_ok()) return status;
  return written;
}

}  // namespace zerowait
