// Synthetic ImageFolder trees: layout, sizes, determinism, and that every file is a real JPEG.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "testing/testing.hpp"
#include "zerowait/shard/synthetic.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using ::zerowait::testing::read_file;
using ::zerowait::testing::TempDir;

// Relative path -> bytes of every file under `dir`.
std::map<std::string, std::string> read_tree(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      files[fs::relative(entry.path(), dir).string()] = read_file(entry.path().string());
    }
  }
  return files;
}

// Decodes fully, treating libjpeg-turbo warnings as failures; returns "" or the error.
std::string decode_error(const std::string& jpeg) {
  tjhandle handle = tjInitDecompress();
  const auto* data = reinterpret_cast<const unsigned char*>(jpeg.data());
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  std::string error;
  if (tjDecompressHeader3(handle, data, jpeg.size(), &width, &height, &subsamp, &colorspace) != 0) {
    error = tjGetErrorStr2(handle);
  } else {
    std::vector<unsigned char> pixels(size_t(width) * height * 3);
    if (tjDecompress2(handle, data, jpeg.size(), pixels.data(), width, 0, height, TJPF_RGB,
                      TJFLAG_STOPONWARNING) != 0) {
      error = tjGetErrorStr2(handle);
    }
  }
  tjDestroy(handle);
  return error;
}

// Sizes of the COM (comment) segments between SOI and the first other marker.
std::vector<size_t> comment_segments(const std::string& jpeg) {
  std::vector<size_t> sizes;
  size_t pos = 2;
  while (pos + 4 <= jpeg.size() && uint8_t(jpeg[pos]) == 0xFF && uint8_t(jpeg[pos + 1]) == 0xFE) {
    const size_t length = (size_t(uint8_t(jpeg[pos + 2])) << 8) | uint8_t(jpeg[pos + 3]);
    sizes.push_back(2 + length);
    pos += 2 + length;
  }
  return sizes;
}

SyntheticImageFolderOptions options_for(const std::string& dir, uint64_t files, uint32_t classes) {
  SyntheticImageFolderOptions options;
  options.out_dir = dir;
  options.files = files;
  options.classes = classes;
  options.seed = 42;
  options.threads = 2;
  return options;
}

TEST(Synthetic, WritesImageFolderLayoutWithSizesInRange) {
  TempDir tmp;
  SyntheticImageFolderOptions options = options_for(tmp / "data", 60, 4);
  Result<SyntheticReport> report = generate_imagefolder(options);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->files, 60u);

  const auto files = read_tree(options.out_dir);
  ASSERT_EQ(files.size(), 60u);
  uint64_t total = 0;
  for (uint64_t i = 0; i < 60; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "class_%03u/img_%08llu.jpg", unsigned(i % 4),
                  static_cast<unsigned long long>(i));
    auto it = files.find(name);
    ASSERT_NE(it, files.end()) << name;
    const std::string& jpeg = it->second;
    EXPECT_GE(jpeg.size(), options.min_bytes) << name;
    EXPECT_LE(jpeg.size(), options.max_bytes) << name;
    EXPECT_EQ(decode_error(jpeg), "") << name;
    total += jpeg.size();
  }
  EXPECT_EQ(report->bytes, total);
}

TEST(Synthetic, SameBytesWhateverTheThreadCount) {
  TempDir tmp;
  SyntheticImageFolderOptions one = options_for(tmp / "one", 40, 3);
  one.threads = 1;
  SyntheticImageFolderOptions two = options_for(tmp / "two", 40, 3);
  two.threads = 2;
  SyntheticImageFolderOptions other_seed = options_for(tmp / "seed", 40, 3);
  other_seed.seed = 43;
  ASSERT_TRUE(generate_imagefolder(one).is_ok());
  ASSERT_TRUE(generate_imagefolder(two).is_ok());
  ASSERT_TRUE(generate_imagefolder(other_seed).is_ok());

  const auto a = read_tree(one.out_dir);
  const auto b = read_tree(two.out_dir);
  const auto c = read_tree(other_seed.out_dir);
  ASSERT_EQ(a.size(), 40u);
  EXPECT_TRUE(a == b);
  size_t same = 0;
  for (const auto& [name, bytes] : a) same += c.at(name) == bytes;
  EXPECT_EQ(same, 0u);
}

TEST(Synthetic, HitsExactSizesIncludingSeveralCommentSegments) {
  TempDir tmp;
  size_t most_segments = 0;
  for (uint64_t size : {uint64_t{2000}, uint64_t{12345}, uint64_t{1500000}}) {
    SyntheticImageFolderOptions options = options_for(tmp / std::to_string(size), 3, 1);
    options.min_bytes = options.max_bytes = size;
    ASSERT_TRUE(generate_imagefolder(options).is_ok()) << size;
    for (const auto& [name, jpeg] : read_tree(options.out_dir)) {
      EXPECT_EQ(jpeg.size(), size) << name;
      EXPECT_EQ(decode_error(jpeg), "") << name;
      most_segments = std::max(most_segments, comment_segments(jpeg).size());
    }
  }
  // Padding past one segment's 65,537 bytes is split (the output is deterministic, so this
  // holds for this seed every run).
  EXPECT_GE(most_segments, 2u);
}

TEST(Synthetic, TinyRangeNearTheSmallestJpeg) {
  TempDir tmp;
  SyntheticImageFolderOptions options = options_for(tmp / "tiny", 10, 2);
  options.min_bytes = 0;
  options.max_bytes = 900;
  ASSERT_TRUE(generate_imagefolder(options).is_ok());
  for (const auto& [name, jpeg] : read_tree(options.out_dir)) {
    EXPECT_LE(jpeg.size(), 900u) << name;
    EXPECT_EQ(decode_error(jpeg), "") << name;
  }
}

TEST(Synthetic, ReportsProgressEndingAtTheTotal) {
  TempDir tmp;
  SyntheticImageFolderOptions options = options_for(tmp / "data", 30, 2);
  std::vector<uint64_t> seen;
  options.on_progress = [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, 30u);
    seen.push_back(done);
  };
  ASSERT_TRUE(generate_imagefolder(options).is_ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), 30u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
}

TEST(Synthetic, ZeroFilesIsAnEmptyTree) {
  TempDir tmp;
  Result<SyntheticReport> report = generate_imagefolder(options_for(tmp / "empty", 0, 5));
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->files, 0u);
  EXPECT_EQ(report->bytes, 0u);
}

TEST(Synthetic, RejectsUnusableOptions) {
  TempDir tmp;
  SyntheticImageFolderOptions options = options_for(tmp / "x", 10, 2);
  options.min_bytes = 5000;
  options.max_bytes = 4000;
  Result<SyntheticReport> r = generate_imagefolder(options);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("min_bytes 5000 is larger than max_bytes 4000"),
            std::string::npos);

  options.min_bytes = 0;
  options.max_bytes = 100;
  r = generate_imagefolder(options);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("below the smallest JPEG"), std::string::npos);

  options = options_for(tmp / "x", 10, 0);
  EXPECT_EQ(generate_imagefolder(options).status().code(), ErrorCode::kInvalidArgument);
  options = options_for("", 10, 1);
  EXPECT_EQ(generate_imagefolder(options).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Synthetic, ErrorsNameThePath) {
  TempDir tmp;
  // A regular file where a class directory must go.
  testing::write_file(tmp / "data/class_001", "not a directory");
  Result<SyntheticReport> r = generate_imagefolder(options_for(tmp / "data", 10, 2));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("class_001"), std::string::npos) << r.status().to_string();

  // A class directory that cannot be written into.
  TempDir tmp2;
  testing::write_file(tmp2 / "data/class_000/img_00000000.jpg/blocker", "");
  r = generate_imagefolder(options_for(tmp2 / "data", 4, 1));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("img_00000000.jpg"), std::string::npos)
      << r.status().to_string();
}

}  // namespace
}  // namespace zerowait
