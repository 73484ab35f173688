// zw_bench_image_transform: what a JPEG costs on the decode stage. For three sets of JPEGs (the
// synthetic ImageFolder's typical 10-60 KB files, ~300x300 and ~1000x750 photos-like pictures)
// it times, in CPU time per image on one thread: a plain full decode with TurboJPEG (the floor any
// decode-everything pipeline pays), ImageDecoder with RandomResizedCrop(224) + flip with and
// without DCT scaling, and Resize(256) + CenterCrop(224); then RandomResizedCrop throughput
// with one decoder per thread. Prints a table.
//
//   zw_bench_image_transform [--files N] [--threads N] [--repeats N]
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "zerowait/loader/image_transform.hpp"
#include "zerowait/shard/synthetic.hpp"

namespace zerowait {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::byte>;

struct ImageSet {
  std::string name;
  std::vector<Bytes> jpegs;
  double mean_width = 0, mean_height = 0, mean_bytes = 0;
};

// A picture like the synthetic generator's: a gradient, soft waves and per-pixel noise, so the
// JPEG is about as large as a photo of that size.
Bytes photo_like(int width, int height, uint64_t seed) {
  std::vector<uint8_t> pixels(size_t(width) * height * 3);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const int noise = int((state >> 59) & 31) - 16;
        const double wave = 60 * std::sin((x * (c + 1) + y * (3 - c)) * 0.02 + double(seed));
        const int v = int(128 + 80.0 * (x - y) / (width + height) + wave) + noise;
        pixels[(size_t(y) * width + x) * 3 + c] = uint8_t(std::clamp(v, 0, 255));
      }
    }
  }
  tjhandle handle = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  if (tjCompress2(handle, pixels.data(), width, 0, height, TJPF_RGB, &jpeg, &size, TJSAMP_420, 85,
                  0) != 0) {
    std::fprintf(stderr, "tjCompress2: %s\n", tjGetErrorStr2(handle));
    std::exit(1);
  }
  Bytes out(size);
  std::memcpy(out.data(), jpeg, size);
  tjFree(jpeg);
  tjDestroy(handle);
  return out;
}

void describe(ImageSet& set) {
  tjhandle handle = tjInitDecompress();
  for (const Bytes& j : set.jpegs) {
    int w = 0, h = 0, subsamp = 0, cs = 0;
    tjDecompressHeader3(handle, reinterpret_cast<const unsigned char*>(j.data()), j.size(), &w, &h,
                        &subsamp, &cs);
    set.mean_width += w;
    set.mean_height += h;
    set.mean_bytes += double(j.size());
  }
  tjDestroy(handle);
  const double n = double(set.jpegs.size());
  set.mean_width /= n;
  set.mean_height /= n;
  set.mean_bytes /= n;
}

ImageSet synthetic_set(size_t files) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("zw-bench-image-" + std::to_string(::getpid())))
          .string();
  SyntheticImageFolderOptions options;
  options.out_dir = dir;
  options.files = files;
  auto report = generate_imagefolder(options);
  if (!report.is_ok()) {
    std::fprintf(stderr, "generate_imagefolder: %s\n", report.status().to_string().c_str());
    std::exit(1);
  }
  ImageSet set{"synthetic ImageFolder", {}};
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Bytes b(s.size());
    std::memcpy(b.data(), s.data(), s.size());
    set.jpegs.push_back(std::move(b));
  }
  std::filesystem::remove_all(dir);
  return set;
}

ImageSet sized_set(const char* name, int width, int height, size_t files) {
  ImageSet set{name, {}};
  for (size_t i = 0; i < files; ++i) set.jpegs.push_back(photo_like(width, height, i));
  return set;
}

// CPU seconds of the calling thread: on a shared machine, wall time also counts other work.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// CPU microseconds per image, best of `repeats` passes over the set.
template <typename F>
double time_per_image(const ImageSet& set, int repeats, F&& work) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double start = thread_cpu_seconds();
    for (size_t i = 0; i < set.jpegs.size(); ++i) work(set.jpegs[i], uint64_t(r) * 1000003 + i);
    best = std::min(best, thread_cpu_seconds() - start);
  }
  return best * 1e6 / double(set.jpegs.size());
}

void check(const Status& s) {
  if (!s.is_ok()) {
    std::fprintf(stderr, "decode failed: %s\n", s.to_string().c_str());
    std::exit(1);
  }
}

// Images per second with one decoder per thread, each thread taking every threads-th image.
double throughput(const ImageSet& set, const ImageTransform& t, int threads, int repeats) {
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      ImageDecoder decoder;
      std::vector<uint8_t> out(size_t(t.size) * t.size * 3);
      for (int r = 0; r < repeats; ++r) {
        for (size_t i = size_t(w); i < set.jpegs.size(); i += size_t(threads)) {
          check(decoder.decode(set.jpegs[i], t, uint64_t(r) * 1000003 + i, out));
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  return double(set.jpegs.size()) * repeats / s;
}

int run(int argc, char** argv) {
  size_t files = 400;
  int threads = 2, repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--files" && i + 1 < argc) {
      files = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--files N] [--threads N] [--repeats N]\n", argv[0]);
      return 2;
    }
  }

  std::vector<ImageSet> sets;
  sets.push_back(synthetic_set(files));
  sets.push_back(sized_set("300x300", 300, 300, std::max<size_t>(files / 4, 1)));
  sets.push_back(sized_set("1000x750", 1000, 750, std::max<size_t>(files / 8, 1)));

  const ImageTransform rrc{.random_flip = true};
  ImageTransform rrc_full = rrc;
  rrc_full.dct_downscale = false;
  const ImageTransform centre{.mode = ImageTransform::Mode::kResizeCenterCrop};

  std::printf("%-22s %6s %11s %9s | %10s %10s %10s %10s | %12s\n", "set", "images", "mean size",
              "mean KB", "tj full", "RRC224", "RRC no-DCT", "centre224", "RRC img/s");
  std::printf("%-22s %6s %11s %9s | %10s %10s %10s %10s | %12s\n", "", "", "(px)", "", "us/img",
              "us/img", "us/img", "us/img", ("x" + std::to_string(threads) + " thr").c_str());
  for (ImageSet& set : sets) {
    describe(set);
    tjhandle tj = tjInitDecompress();
    std::vector<uint8_t> full;
    const double tj_us = time_per_image(set, repeats, [&](const Bytes& j, uint64_t) {
      int w = 0, h = 0, subsamp = 0, cs = 0;
      const auto* data = reinterpret_cast<const unsigned char*>(j.data());
      tjDecompressHeader3(tj, data, j.size(), &w, &h, &subsamp, &cs);
      full.resize(size_t(w) * h * 3);
      if (tjDecompress2(tj, data, j.size(), full.data(), w, 0, h, TJPF_RGB, 0) != 0) std::exit(1);
    });
    tjDestroy(tj);
    ImageDecoder decoder;
    std::vector<uint8_t> out(224 * 224 * 3);
    auto ours = [&](const ImageTransform& t) {
      return time_per_image(set, repeats, [&](const Bytes& j, uint64_t seed) {
        check(decoder.decode(j, t, seed, out));
      });
    };
    const double rrc_us = ours(rrc), rrc_full_us = ours(rrc_full), centre_us = ours(centre);
    const double per_second = throughput(set, rrc, threads, repeats);
    std::printf("%-22s %6zu %5.0fx%-5.0f %9.1f | %10.0f %10.0f %10.0f %10.0f | %12.0f\n",
                set.name.c_str(), set.jpegs.size(), set.mean_width, set.mean_height,
                set.mean_bytes / 1000, tj_us, rrc_us, rrc_full_us, centre_us, per_second);
  }
  return 0;
}

}  // namespace
}  // namespace zerowait

int main(int argc, char** argv) { return zerowait::run(argc, argv); }
