#include "zerowait/shard/synthetic.hpp"

#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/file.hpp"
#include "common/random.hpp"

namespace zerowait {
namespace {

constexpr int kQuality = 90;
constexpr int kSubsampling = TJSAMP_420;
constexpr int kMinSide = 8;
constexpr double kHeaderBytes = 620;     // SOI, JFIF, quantisation and Huffman tables, SOF, SOS
constexpr double kImageShare = 0.95;     // aim the image at this share of the target, pad the rest
constexpr double kMinImageShare = 0.85;  // accept an image this share of the target or larger
constexpr int kMaxEncodes = 8;
// A COM segment: FF FE, a 2-byte length that counts itself, then the payload.
constexpr size_t kComHeader = 4;
constexpr size_t kComMaxSegment = kComHeader + 65533;

using internal::mix64;

// splitmix64 over a counter: decorrelates (seed, file index) into per-file streams, so a file's
// bytes depend on nothing but the options and its index, whatever thread makes it. Not
// common/random.hpp's Rng: the files a seed makes stay the ones it made before.
class SplitMixStream {
 public:
  explicit SplitMixStream(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_++); }
  // Uniform in [lo, hi].
  uint64_t between(uint64_t lo, uint64_t hi) { return hi <= lo ? lo : lo + next() % (hi - lo + 1); }
  double unit() { return double(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

struct Encoder {
  tjhandle handle = nullptr;
  std::vector<unsigned char> pixels;  // reused between files
  Encoder() : handle(tjInitCompress()) {}
  ~Encoder() {
    if (handle != nullptr) tjDestroy(handle);
  }
  Encoder(const Encoder&) = delete;
  Encoder& operator=(const Encoder&) = delete;

  // Encodes the first width*height RGB pixels of `pixels` into `out`.
  Status encode(int width, int height, std::string* out) {
    unsigned char* jpeg = nullptr;
    unsigned long jpeg_size = 0;
    if (tjCompress2(handle, pixels.data(), width, 0, height, TJPF_RGB, &jpeg, &jpeg_size,
                    kSubsampling, kQuality, 0) != 0) {
      Status error(ErrorCode::kInternal, std::string("tjCompress2: ") + tjGetErrorStr2(handle));
      tjFree(jpeg);
      return error;
    }
    out->assign(reinterpret_cast<const char*>(jpeg), jpeg_size);
    tjFree(jpeg);
    return Status::ok();
  }
};

// What a file's picture looks like, drawn once per file so that re-encoding it at another size
// keeps its bytes-per-pixel: a two-colour gradient at an angle, a few soft discs, and per-pixel
// noise (the noise is what makes the JPEG about as large as a photo's).
struct Picture {
  int c0[3], c1[3];
  double gx, gy;  // gradient direction
  struct Disc {
    double x, y, r;  // as fractions of the image size
    int color[3];
  };
  std::vector<Disc> discs;
  int noise;      // +-noise per channel
  double aspect;  // width / height
};

Picture draw_picture(SplitMixStream& rng) {
  static constexpr double kAspects[] = {1.0, 4.0 / 3, 3.0 / 4, 3.0 / 2, 2.0 / 3};
  Picture pic;
  for (int c = 0; c < 3; ++c) {
    pic.c0[c] = int(rng.between(0, 255));
    pic.c1[c] = int(rng.between(0, 255));
  }
  const double angle = rng.unit() * 6.283185307179586;
  pic.gx = std::cos(angle);
  pic.gy = std::sin(angle);
  pic.discs.resize(rng.between(1, 4));
  for (Picture::Disc& d : pic.discs) {
    d.x = rng.unit();
    d.y = rng.unit();
    d.r = 0.1 + 0.3 * rng.unit();
    for (int& c : d.color) c = int(rng.between(0, 255));
  }
  pic.noise = int(rng.between(8, 24));
  pic.aspect = kAspects[rng.between(0, std::size(kAspects) - 1)];
  return pic;
}

// Median JPEG bytes per pixel of a Picture at kQuality, measured over this generator's output
// (0.21 at noise 8, 0.43 at noise 24). Only the first guess uses it; later ones use the
// file's own measured rate.
double estimated_bytes_per_pixel(const Picture& pic) { return 0.09 + 0.0143 * pic.noise; }

// Width and height near `pixels` in total, with the picture's aspect ratio.
std::pair<int, int> dimensions(const Picture& pic, double pixels) {
  const int width = std::max(kMinSide, int(std::sqrt(pixels * pic.aspect)));
  const int height = std::max(kMinSide, int(pixels / width));
  return {width, height};
}

void paint(const Picture& pic, SplitMixStream& rng, int width, int height,
           std::vector<unsigned char>* out) {
  out->resize(size_t(width) * height * 3);
  const double gx = pic.gx / width, gy = pic.gy / height;
  const double side = std::min(width, height);
  uint64_t bits = 0;
  int bits_left = 0;
  unsigned char* p = out->data();
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double t = std::clamp(0.5 + (x - width / 2.0) * gx + (y - height / 2.0) * gy, 0.0, 1.0);
      int rgb[3];
      for (int c = 0; c < 3; ++c) rgb[c] = int(pic.c0[c] + (pic.c1[c] - pic.c0[c]) * t);
      for (const Picture::Disc& d : pic.discs) {
        const double dx = x - d.x * width, dy = y - d.y * height, r = d.r * side;
        if (dx * dx + dy * dy < r * r) {
          for (int c = 0; c < 3; ++c) rgb[c] = (rgb[c] + 3 * d.color[c]) / 4;
        }
      }
      for (int c = 0; c < 3; ++c) {
        if (bits_left == 0) {
          bits = rng.next();
          bits_left = 8;
        }
        const int n = int(((bits & 0xFF) * (2 * pic.noise + 1)) >> 8) - pic.noise;
        bits >>= 8;
        --bits_left;
        *p++ = static_cast<unsigned char>(std::clamp(rgb[c] + n, 0, 255));
      }
    }
  }
}

// The one image every target can fall back to: its size is the generator's floor.
Status encode_floor_image(Encoder& encoder, std::string* out) {
  encoder.pixels.assign(size_t(kMinSide) * kMinSide * 3, 128);
  return encoder.encode(kMinSide, kMinSide, out);
}

// Inserts COM segments right after SOI so the file is exactly `target` bytes. Needs
// target == jpeg.size() or target >= jpeg.size() + kComHeader.
void pad_to(SplitMixStream& rng, const std::string& jpeg, uint64_t target, std::string* out) {
  uint64_t gap = target - jpeg.size();
  out->clear();
  out->reserve(target);
  out->append(jpeg, 0, 2);  // SOI
  const uint64_t segments = (gap + kComMaxSegment - 1) / kComMaxSegment;
  for (uint64_t i = 0; i < segments; ++i) {
    // Even split: every segment is at least kComHeader bytes (see pad_to's contract).
    const uint64_t segment = gap / (segments - i);
    gap -= segment;
    const uint64_t length = segment - 2;  // the length field counts itself, not the marker
    out->push_back(char(0xFF));
    out->push_back(char(0xFE));
    out->push_back(char(length >> 8));
    out->push_back(char(length & 0xFF));
    // Printable filler: no FF bytes for naive marker scanners to trip on, and not trivially
    // compressible either.
    for (uint64_t j = 0; j < segment - kComHeader; ++j) out->push_back(char('a' + rng.next() % 26));
  }
  out->append(jpeg, 2);
}

// out_dir/class_XXX: the one place the ImageFolder layout is spelled.
std::string class_dir(const std::string& out_dir, uint64_t c) {
  char name[32];
  std::snprintf(name, sizeof name, "/class_%03llu", static_cast<unsigned long long>(c));
  return out_dir + name;
}

struct Job {
  Job(const SyntheticImageFolderOptions& o, uint64_t floor) : options(o), floor_bytes(floor) {}

  const SyntheticImageFolderOptions& options;
  const uint64_t floor_bytes;  // size of the floor image: the smallest file this generator writes
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;  // guards error and wakes the reporting thread
  std::condition_variable changed;
  Status error;

  std::string path_of(uint64_t i) const {
    char name[32];
    std::snprintf(name, sizeof name, "/img_%08llu.jpg", static_cast<unsigned long long>(i));
    return class_dir(options.out_dir, i % options.classes) + name;
  }
};

// Makes file i: an image whose JPEG fits the file's target size, padded to exactly that size.
Status make_file(Job& job, uint64_t i, Encoder& encoder, std::string* jpeg, std::string* file) {
  SplitMixStream rng(mix64(job.options.seed) ^ mix64(i + 0x5EED));
  const uint64_t lo = std::max(job.options.min_bytes, job.floor_bytes + kComHeader);
  const uint64_t target = rng.between(lo, job.options.max_bytes);
  const auto fits = [&](uint64_t size) { return size == target || size + kComHeader <= target; };
  const std::string path = job.path_of(i);

  // Aim the image at kImageShare of the target and pad the rest: re-encode with the rate this
  // picture actually compressed at until the image fits and the padding is small.
  const Picture pic = draw_picture(rng);
  const double goal = std::max(1.0, target * kImageShare - kHeaderBytes);
  double bytes_per_pixel = estimated_bytes_per_pixel(pic);
  std::string best;
  for (int attempt = 0; attempt < kMaxEncodes; ++attempt) {
    // After a few misses, undershoot ever more so the loop cannot oscillate above the target.
    const double shrink = attempt < 3 ? 1.0 : std::pow(0.8, attempt - 2);
    auto [width, height] = dimensions(pic, goal / bytes_per_pixel * shrink);
    paint(pic, rng, width, height, &encoder.pixels);
    ZW_RETURN_IF_ERROR(encoder.encode(width, height, jpeg).with_context("encode '" + path + "'"));
    const double size = double(jpeg->size());
    if (fits(jpeg->size()) && jpeg->size() > best.size()) {
      best.swap(*jpeg);
      if (size >= target * kMinImageShare) break;
    }
    bytes_per_pixel = std::max(1.0, size - kHeaderBytes) / (double(width) * height);
  }
  if (best.empty()) {
    ZW_RETURN_IF_ERROR(encode_floor_image(encoder, &best).with_context("encode '" + path + "'"));
  }
  jpeg->swap(best);

  pad_to(rng, *jpeg, target, file);
  ZW_ASSIGN_OR_RETURN(internal::File out, internal::File::create(path));
  ZW_RETURN_IF_ERROR(out.write_all(std::as_bytes(std::span(file->data(), file->size()))));
  ZW_RETURN_IF_ERROR(out.close());
  job.bytes += file->size();
  return Status::ok();
}

void run_worker(Job& job) {
  Encoder encoder;
  std::string jpeg, file;
  Status status = encoder.handle == nullptr ? Status(ErrorCode::kInternal, "tjInitCompress failed")
                                            : Status::ok();
  while (status.is_ok() && !job.failed) {
    const uint64_t i = job.next++;
    if (i >= job.options.files) break;
    status = make_file(job, i, encoder, &jpeg, &file);
    ++job.done;
    job.changed.notify_one();
  }
  if (!status.is_ok()) {
    std::lock_guard lock(job.mutex);
    if (!job.failed.exchange(true)) job.error = status;
  }
  job.changed.notify_one();
}

Status validate(const SyntheticImageFolderOptions& o, uint64_t floor_bytes) {
  if (o.out_dir.empty()) return invalid_argument("synthetic data: no output directory");
  if (o.classes == 0) return invalid_argument("synthetic data: classes must be at least 1");
  if (o.min_bytes > o.max_bytes) {
    return invalid_argument("synthetic data: min_bytes " + std::to_string(o.min_bytes) +
                            " is larger than max_bytes " + std::to_string(o.max_bytes));
  }
  if (o.max_bytes < floor_bytes + kComHeader) {
    return invalid_argument("synthetic data: max_bytes " + std::to_string(o.max_bytes) +
                            " is below the smallest JPEG this generator writes (" +
                            std::to_string(floor_bytes + kComHeader) + " bytes)");
  }
  return Status::ok();
}

}  // namespace

Result<SyntheticReport> generate_imagefolder(const SyntheticImageFolderOptions& options) {
  uint64_t floor_bytes = 0;
  {
    Encoder encoder;
    std::string floor;
    ZW_RETURN_IF_ERROR(encode_floor_image(encoder, &floor));
    floor_bytes = floor.size();
  }
  ZW_RETURN_IF_ERROR(validate(options, floor_bytes));
  for (uint64_t c = 0; c < std::min<uint64_t>(options.classes, options.files); ++c) {
    const std::string dir = class_dir(options.out_dir, c);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return errno_status(ec.value(), "create directory", dir);
  }

  Job job(options, floor_bytes);
  unsigned threads = options.threads != 0 ? options.threads : std::thread::hardware_concurrency();
  threads = unsigned(std::clamp<uint64_t>(threads, 1, std::max<uint64_t>(options.files, 1)));
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) {
    try {
      workers.emplace_back(run_worker, std::ref(job));
    } catch (const std::system_error& e) {
      // Fewer threads still finish the job; none at all is an error.
      if (workers.empty())
        return Status(ErrorCode::kInternal, std::string("start thread: ") + e.what());
      break;
    }
  }

  // Progress is reported from the caller's thread, so a callback never runs concurrently.
  uint64_t reported = 0;
  while (true) {
    std::unique_lock lock(job.mutex);
    job.changed.wait_for(lock, std::chrono::milliseconds(100));
    const uint64_t done = job.done;
    const bool finished = done >= options.files || job.failed;
    lock.unlock();
    if (options.on_progress && done != reported && !finished)
      options.on_progress(done, options.files);
    reported = done;
    if (finished) break;
  }
  for (std::thread& w : workers) w.join();
  if (job.failed) return job.error;
  if (options.on_progress) options.on_progress(options.files, options.files);
  return SyntheticReport{options.files, job.bytes.load()};
}

}  // namespace zerowait
