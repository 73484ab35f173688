// A save's tensor files. Their checksums (docs/checkpoint.md, "A file's checksum"): safetensors
// files are checked by their segments — header, then each non-empty tensor — so that every byte
// is covered while the writer hashes each tensor once; compressed files and version-1 manifests
// by their whole bytes. And the staging pool laid out as their data, so that O_DIRECT writes it
// without a copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/checkpoint_io.hpp"
#include "checkpoint/checkpoint_manifest.hpp"
#include "checkpoint/checkpointer_state.hpp"
#include "checkpoint/file_digest.hpp"
#include "checkpoint/part_writer.hpp"
#include "checkpoint/safetensors.hpp"
#include "common/xxhash.hpp"
#include "testing/checkpoint_state.hpp"
#include "testing/testing.hpp"
#include "zerowait/checkpoint/checkpointer.hpp"
#include "zerowait/checkpoint/maintenance.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

using testing::TempDir;
using State = testing::TrainingState;
using testing::open_or_die;
using testing::read_all;
using testing::save_and_wait;

uint64_t le64_digest(const std::vector<uint64_t>& parts) {
  std::string bytes;
  for (uint64_t p : parts) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(p >> (8 * i)));
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

// `bytes` given to a FileDigest for `file` in pieces of random sizes, some a byte long.
uint64_t digest_in_pieces(const StoredFile& file, const std::string& bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  internal::FileDigest digest(file, file.path);
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min<size_t>(bytes.size() - at, rng() % 3 == 0 ? 1 : rng() % 9000);
    const Status s = digest.update(std::as_bytes(std::span(bytes.data() + at, n)));
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    at += n;
  }
  return digest.digest();
}

// One file of an empty, a one-float and two larger tensors.
struct SavedStep {
  TempDir dir;
  std::shared_ptr<Store> target = make_local_store(dir.path());
  State state = State::make({0, 1, 1000, 300000});
  RankManifest manifest;
  std::string path;   // of the tensor file
  std::string bytes;  // its bytes

  explicit SavedStep(Compression compression = Compression::kNone) {
    state.fill_all(5);
    CheckpointOptions options;
    options.compression = compression;
    auto cp = open_or_die(target, options);
    save_and_wait(*cp, state.request(1));
    manifest = read_rank_manifest(*target, 1, 0).value();
    path = dir / manifest.files.at(0).path;
    bytes = testing::read_file(path);
  }
};

TEST(CheckpointChecksum, ASafetensorsFileIsCheckedByItsHeaderAndEachNonEmptyTensor) {
  SavedStep saved;
  ASSERT_EQ(saved.manifest.files.size(), 1u);
  const StoredFile& file = saved.manifest.files[0];
  EXPECT_EQ(file.checksum, FileChecksum::kSegments);
  auto header = internal::safetensors::decode_header(saved.bytes, saved.bytes.size(), file.path);
  ASSERT_TRUE(header.is_ok()) << header.status().to_string();
  std::vector<uint64_t> parts{XXH3_64bits(saved.bytes.data(), header.value().data_start)};
  for (const StoredTensor& t : saved.manifest.tensors) {
    if (t.nbytes == 0) continue;
    ASSERT_EQ(XXH3_64bits(saved.bytes.data() + t.offset, t.nbytes), t.xxh3) << t.name;
    parts.push_back(t.xxh3);
  }
  EXPECT_EQ(file.xxh3, le64_digest(parts));
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    EXPECT_EQ(digest_in_pieces(file, saved.bytes, seed), file.xxh3) << "seed " << seed;
  }
}

TEST(CheckpointChecksum, AFlippedByteAnywhereInTheFileIsFound) {
  SavedStep saved;
  const uint64_t data_start =
      internal::safetensors::decode_header(saved.bytes, saved.bytes.size(), "").value().data_start;
  // The length bytes, the JSON, its padding (the space before the data), the first and last
  // byte of each non-empty tensor.
  std::vector<size_t> offsets{0, 12, data_start - 1};
  for (const StoredTensor& t : saved.manifest.tensors) {
    if (t.nbytes == 0) continue;
    offsets.push_back(t.offset);
    offsets.push_back(t.offset + t.nbytes - 1);
  }
  for (size_t offset : offsets) {
    std::string damaged = saved.bytes;
    damaged[offset] ^= 0x10;
    testing::write_file(saved.path, damaged);
    auto report = verify_step(*saved.target, 1);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    ASSERT_EQ(report.value().problems.size(), 1u) << "offset " << offset;
    EXPECT_NE(report.value().problems[0].find(saved.manifest.files[0].path), std::string::npos)
        << report.value().problems[0];
  }
  testing::write_file(saved.path, saved.bytes);
  EXPECT_TRUE(verify_step(*saved.target, 1).value().problems.empty());
}

TEST(CheckpointChecksum, ACompressedFileIsCheckedByItsWholeBytes) {
  SavedStep saved(Compression::kZstd);
  const StoredFile& file = saved.manifest.files.at(0);
  EXPECT_EQ(file.checksum, FileChecksum::kWholeFile);
  EXPECT_EQ(file.xxh3, XXH3_64bits(saved.bytes.data(), saved.bytes.size()));
  EXPECT_EQ(digest_in_pieces(file, saved.bytes, 7), file.xxh3);
  EXPECT_TRUE(verify_step(*saved.target, 1).value().problems.empty());
}

// A step written before files' "xxh3_of" (rank manifest version 1): its checksums are of whole
// files, and it still verifies, restores and mirrors.
TEST(CheckpointChecksum, AVersionOneStepWithWholeFileChecksumsStillReadsVerifiesAndMirrors) {
  SavedStep saved;
  const std::string rank_path = saved.dir / "step-1/rank-00000.json";
  nlohmann::json rank = nlohmann::json::parse(testing::read_file(rank_path));
  rank["version"] = 1;
  for (auto& f : rank["files"]) {
    f.erase("xxh3_of");
    f["xxh3"] = internal::hex64(XXH3_64bits(saved.bytes.data(), saved.bytes.size()));
  }
  const std::string rank_text = rank.dump(1) + "\n";
  testing::write_file(rank_path, rank_text);
  const std::string record_path = saved.dir / "step-1/manifest.json";
  nlohmann::json record = nlohmann::json::parse(testing::read_file(record_path));
  record["ranks"][0]["bytes"] = rank_text.size();
  record["ranks"][0]["xxh3"] = internal::hex64(XXH3_64bits(rank_text.data(), rank_text.size()));
  testing::write_file(record_path, record.dump(1) + "\n");

  const RankManifest manifest = read_rank_manifest(*saved.target, 1, 0).value();
  EXPECT_EQ(manifest.files.at(0).checksum, FileChecksum::kWholeFile);
  EXPECT_TRUE(verify_step(*saved.target, 1).value().problems.empty());
  EXPECT_EQ(read_all(*saved.target, 1), saved.state.values);
  TempDir mirror_dir;
  auto mirror = make_local_store(mirror_dir.path());
  const Status mirrored =
      internal::mirror_step(*saved.target, *mirror, 1, std::chrono::seconds(30));
  ASSERT_TRUE(mirrored.is_ok()) << mirrored.to_string();
  EXPECT_TRUE(verify_step(*mirror, 1).value().problems.empty());

  // The damage a whole-file checksum finds, found.
  std::string damaged = saved.bytes;
  damaged[20] ^= 0x01;
  testing::write_file(saved.path, damaged);
  EXPECT_EQ(verify_step(*saved.target, 1).value().problems.size(), 1u);
}

TEST(CheckpointChecksum, AnUnknownChecksumKindIsCorruptNamingTheFile) {
  SavedStep saved;
  const std::string rank_path = saved.dir / "step-1/rank-00000.json";
  const std::string text = testing::read_file(rank_path);
  const size_t at = text.find("\"segments\"");
  ASSERT_NE(at, std::string::npos);
  std::string changed = text;
  changed.replace(at, 10, "\"sha-999\" ");
  auto manifest = internal::decode_rank_manifest(changed, rank_path);
  ASSERT_EQ(manifest.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(manifest.status().message().find("sha-999"), std::string::npos)
      << manifest.status().message();
  EXPECT_NE(manifest.status().message().find(saved.manifest.files[0].path), std::string::npos)
      << manifest.status().message();
}

TEST(CheckpointChecksum, CopyAndHashGivesTheBytesAndTheirHashAtEverySizeAndAlignment) {
  // The copy streams 16-byte-aligned stores and copies the unaligned ends plainly: every size
  // around a store's and a chunk's width, at several alignments of either side.
  constexpr std::byte kUntouched{0x5a};
  auto untouched = [&](const std::byte* begin, const std::byte* end) {
    return std::all_of(begin, end, [&](std::byte b) { return b == kUntouched; });
  };
  std::mt19937 rng(3);
  std::vector<std::byte> source((1 << 20) + 16);
  for (std::byte& b : source) b = static_cast<std::byte>(rng());
  for (size_t size : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{63}, size_t{64},
                      size_t{65}, size_t{100}, size_t{128 << 10}, size_t{(128 << 10) + 1},
                      size_t{(1 << 20) - 7}}) {
    for (size_t from : {size_t{0}, size_t{3}}) {
      for (size_t to : {size_t{0}, size_t{1}, size_t{8}, size_t{15}}) {
        std::vector<std::byte> copy(size + 32, kUntouched);
        std::byte* dst = copy.data() + to;
        const std::byte* src = source.data() + from;
        internal::Xxh3Stream stream;
        internal::copy_into_xxh3(stream, dst, src, size);
        const std::string where = std::to_string(size) + " bytes, source +" +
                                  std::to_string(from) + ", copy +" + std::to_string(to);
        EXPECT_EQ(stream.digest(), XXH3_64bits(src, size)) << where;
        EXPECT_TRUE(std::equal(src, src + size, dst)) << where;
        // Nothing written before or past the copy.
        EXPECT_TRUE(untouched(copy.data(), dst)) << where;
        EXPECT_TRUE(untouched(dst + size, copy.data() + copy.size())) << where;
      }
    }
  }
}

TEST(CheckpointChecksum, ABackgroundCopyRecordsEachTensorsOwnChecksum) {
  // The writer hashes each tensor as it copies it, one of several pieces (over 32 MiB) across
  // them. Nobody waits for the copy here: the writer does all.
  TempDir dir;
  auto target = make_local_store(dir.path());
  auto cp = open_or_die(target);
  State state = State::make({1000, 300001, (32u << 20) / 4 + 3});
  state.fill_all(5);
  auto pending = cp->begin_save(state.request(1));
  ASSERT_TRUE(pending.is_ok() && pending.value().has_value());
  auto handle = pending.value()->start_copying();
  ASSERT_TRUE(handle.is_ok());
  handle.value().confirm_copy(Status::ok());
  auto result = handle.value().wait();
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  EXPECT_TRUE(result.value().committed);
  const RankManifest manifest = read_rank_manifest(*target, 1, 0).value();
  ASSERT_EQ(manifest.tensors.size(), state.values.size());
  for (const StoredTensor& t : manifest.tensors) {
    const size_t i = static_cast<size_t>(
        std::find(state.names.begin(), state.names.end(), t.name) - state.names.begin());
    ASSERT_LT(i, state.values.size()) << t.name;
    EXPECT_EQ(t.xxh3, XXH3_64bits(state.values[i].data(), state.values[i].size() * 4)) << t.name;
  }
  EXPECT_EQ(read_all(*target, 1), state.values);
}

// A background copy's job made by hand: tensors of `sizes` bytes with random contents, staged
// back to back, cut into pieces of at most `piece` bytes in order, as start_copying() cuts them.
struct CopyJob {
  SaveJob job;
  std::vector<std::vector<std::byte>> sources;
  std::vector<std::byte> staging;

  CopyJob(const std::vector<uint64_t>& sizes, uint64_t piece) {
    std::mt19937 rng(9);
    uint64_t total = 0;
    for (uint64_t size : sizes) {
      TensorToSave t;
      t.nbytes = size;
      job.tensors.push_back(t);
      job.staging_offsets.push_back(total);
      total += size;
      sources.emplace_back(size);
      for (std::byte& b : sources.back()) b = static_cast<std::byte>(rng());
    }
    staging.resize(total);
    job.staging_base = staging.data();
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (uint64_t off = 0; off < sizes[i]; off += piece) {
        job.copy_pieces.push_back({sources[i].data() + off, job.staging(i) + off,
                                   std::min(piece, sizes[i] - off), i});
      }
    }
    job.copy_xxh3.assign(sizes.size(), std::nullopt);
  }
  // Piece `i` as another thread (the training loop's wait) takes it: copied, never hashed.
  void taken_elsewhere(size_t i) {
    ASSERT_EQ(job.next_copy_piece.fetch_add(1), i);
    const SaveJob::CopyPiece& p = job.copy_pieces[i];
    std::memcpy(p.dst, p.src, p.bytes);
    job.copy_pieces_done.fetch_add(1);
  }
  bool staged_as_sources() const {
    for (size_t i = 0; i < sources.size(); ++i) {
      if (!std::equal(sources[i].begin(), sources[i].end(), job.staging(i))) return false;
    }
    return true;
  }
  uint64_t xxh3(size_t i) const { return XXH3_64bits(sources[i].data(), sources[i].size()); }
};

TEST(CheckpointChecksum, ATensorOfSeveralPiecesIsHashedAcrossThemWhenTheWriterTakesThemAll) {
  // Pieces of 1 MiB: a tensor of three pieces (the last short), one of one, one of two.
  const uint64_t piece = 1 << 20;
  const std::vector<uint64_t> sizes{2 * piece + 5, 1000, 2 * piece};
  {
    SCOPED_TRACE("the writer takes every piece");
    CopyJob c(sizes, piece);
    c.job.take_copy_pieces(/*hash=*/true);
    EXPECT_TRUE(c.staged_as_sources());
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(c.job.copy_xxh3[i], c.xxh3(i)) << i;
  }
  {
    SCOPED_TRACE("the first tensor's first piece went to another thread");
    CopyJob c(sizes, piece);
    c.taken_elsewhere(0);
    c.job.take_copy_pieces(/*hash=*/true);
    EXPECT_TRUE(c.staged_as_sources());
    EXPECT_FALSE(c.job.copy_xxh3[0].has_value());  // left to the part writer
    EXPECT_EQ(c.job.copy_xxh3[1], c.xxh3(1));
    EXPECT_EQ(c.job.copy_xxh3[2], c.xxh3(2));
  }
  {
    SCOPED_TRACE("the loop waits for the copy: pieces are only copied");
    CopyJob c(sizes, piece);
    c.job.copy_waited_for = true;
    c.job.take_copy_pieces(/*hash=*/true);
    EXPECT_TRUE(c.staged_as_sources());
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_FALSE(c.job.copy_xxh3[i].has_value()) << i;
  }
}

TEST(CheckpointStaging, IsLaidOutAsTheFilesDataFromPageAlignedStarts) {
  const auto tensor = [](uint64_t nbytes, uint32_t element_size) {
    TensorToSave t;
    t.nbytes = nbytes;
    t.element_size = element_size;
    return t;
  };
  // Files of at most 10,000 bytes: [3 (bool), 4 (a float scalar), 8,000], then [6,000, 2, 0].
  const std::vector<TensorToSave> tensors{tensor(3, 1),    tensor(4, 4), tensor(8000, 4),
                                          tensor(6000, 2), tensor(2, 2), tensor(0, 4)};
  uint64_t total = 0;
  const std::vector<uint64_t> offsets = staging_layout(tensors, 10000, &total);
  // Back to back but for the float's alignment (1 byte after the bool, where the file has none):
  // from there on the file's data and staging are contiguous alike. The second file starts on a
  // page.
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 4, 8, 8192, 14192, 14196}));
  EXPECT_EQ(total, 14196u);
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(offsets[i] % tensors[i].element_size, 0u) << i;
  }
}

}  // namespace
}  // namespace zerowait
