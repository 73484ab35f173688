// DatasetWriter: a dataset written sample by sample from a program is the dataset `pack` makes of
// the same samples, byte for byte; bad images are quarantined as pack does; bad keys and names
// are refused; nothing is a dataset until finish(), and an existing one is kept or replaced.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "testing/testing.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/dataset_writer.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/pack.hpp"

namespace zerowait {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s)); }

// The files directly in `dir`, name -> bytes.
std::map<std::string, std::string> files_in(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    out[e.path().filename().string()] = testing::read_file(e.path().string());
  }
  return out;
}

std::unique_ptr<DatasetWriter> open_writer(DatasetWriterOptions options) {
  auto writer = DatasetWriter::create(std::move(options));
  EXPECT_TRUE(writer.is_ok()) << writer.status().to_string();
  return writer.is_ok() ? std::move(writer).value() : nullptr;
}

// One sample to write: its key, then (name, bytes) fields in order.
struct Sample {
  std::string key;
  std::vector<std::pair<std::string, std::string>> fields;
};

Result<bool> write(DatasetWriter& writer, const Sample& s) {
  std::vector<FieldData> fields;
  for (const auto& [name, data] : s.fields) fields.push_back({name, bytes_of(data)});
  return writer.write(s.key, fields);
}

TEST(DatasetWriter, WritesTheShardsAndManifestPackMakesOfTheSameSamples) {
  TempDir dir;
  for (int i = 0; i < 40; ++i) {
    const std::string stem = dir / ("src/" + std::to_string(i % 3) + "/s" + std::to_string(i));
    testing::write_file(stem + ".jpg", testing::make_jpeg(24 + i, 16, i));
    testing::write_file(stem + ".txt", "caption " + std::to_string(i));
    testing::write_file(stem + ".bin", testing::random_bytes(1000 + 97 * i, i));
  }
  const uint64_t shard_size = 20 << 10;  // several shards
  auto packed = pack({.sources = {dir / "src"}, .out_dir = dir / "packed",
                      .shard_size = shard_size});
  ASSERT_TRUE(packed.is_ok()) << packed.status().to_string();
  ASSERT_GT(packed->shards, 2u);

  // The packed samples, in their order, written again by a program.
  auto source = Dataset::open(dir / "packed");
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  auto writer = open_writer({.out_dir = dir / "written", .shard_size = shard_size});
  ASSERT_NE(writer, nullptr);
  for (uint64_t i = 0; i < (*source)->size(); ++i) {
    auto s = (*source)->read(i);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    std::vector<FieldData> fields;
    for (const FieldView& f : s->view.fields) fields.push_back({f.name, f.bytes});
    auto written = writer->write(s->view.key, fields);
    ASSERT_TRUE(written.is_ok()) << written.status().to_string();
    EXPECT_TRUE(*written);
  }
  EXPECT_EQ(writer->samples(), 40u);
  auto report = writer->finish();
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->samples, 40u);
  EXPECT_EQ(report->shards, packed->shards);
  EXPECT_EQ(report->bytes_in, packed->bytes_in);
  EXPECT_EQ(report->bytes_out, packed->bytes_out);
  EXPECT_EQ(report->manifest_path, dir / "written/manifest.json");
  EXPECT_TRUE(report->quarantined.empty());

  // Shards, manifest and quarantine list are the same bytes.
  EXPECT_EQ(files_in(dir / "written"), files_in(dir / "packed"));
  auto written = Dataset::open(dir / "written");
  ASSERT_TRUE(written.is_ok());
  for (size_t s = 0; s < (*written)->shard_count(); ++s) {
    auto shard = (*written)->shard(s);
    ASSERT_TRUE(shard.is_ok());
    auto bad = (*shard)->verify([](const BadSample&) {});
    ASSERT_TRUE(bad.is_ok()) << bad.status().to_string();
    EXPECT_EQ(*bad, 0u);
  }
  // A second finish() is refused.
  EXPECT_EQ(writer->finish().status().code(), ErrorCode::kInvalidArgument);
}

TEST(DatasetWriter, BadImagesAreQuarantinedAndBadKeysOrNamesRefused) {
  TempDir dir;
  auto writer = open_writer({.out_dir = dir / "out", .classes = {"cat", "dog"}});
  ASSERT_NE(writer, nullptr);
  const std::string jpeg = testing::make_jpeg(32, 32, 1);
  EXPECT_TRUE(write(*writer, {"a", {{"jpg", jpeg}, {"cls", "0"}}}).value());
  // Cut short: quarantined, as pack quarantines a truncated file; the writer goes on.
  auto truncated = write(*writer, {"b", {{"jpg", jpeg.substr(0, jpeg.size() / 2)}, {"cls", "1"}}});
  ASSERT_TRUE(truncated.is_ok()) << truncated.status().to_string();
  EXPECT_FALSE(*truncated);
  EXPECT_EQ(writer->quarantined(), 1u);

  auto refused = [&](const Sample& s, const std::string& says) {
    auto r = write(*writer, s);
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << s.key;
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
  };
  refused({"a", {{"cls", "1"}}}, "sample key 'a' was written before");
  refused({"", {{"cls", "1"}}}, "key");
  refused({"c", {{"x/y", "1"}}}, "/");
  refused({"d", {{"cls", "1"}, {"cls", "2"}}}, "cls");
  EXPECT_TRUE(write(*writer, {"e", {{"jpg", testing::make_jpeg(8, 8, 2)}, {"cls", "1"}}}).value());

  auto report = writer->finish();
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->samples, 2u);
  ASSERT_EQ(report->quarantined.size(), 1u);
  EXPECT_EQ(report->quarantined[0].path, "sample b");
  EXPECT_NE(report->quarantined[0].reason.find("field 'jpg'"), std::string::npos);
  EXPECT_NE(testing::read_file(dir / "out/quarantine.json").find("sample b"), std::string::npos);

  auto ds = Dataset::open(dir / "out");
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ((*ds)->size(), 2u);
  EXPECT_EQ((*ds)->classes(), (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ((*ds)->fields(), (std::vector<std::string>{"cls", "jpg"}));
  auto second = (*ds)->read(1);
  ASSERT_TRUE(second.is_ok());
  EXPECT_EQ(second->view.key, "e");
}

TEST(DatasetWriter, ADatasetExistsOnlyOnceFinishedAndAnOldOneIsKeptOrReplaced) {
  TempDir dir;
  {
    auto writer = open_writer({.out_dir = dir / "out", .shard_size = 4 << 10});
    ASSERT_NE(writer, nullptr);
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(write(*writer, {"k" + std::to_string(i),
                                  {{"bin", testing::random_bytes(3000, i)}}}).is_ok());
    }
    // Destroyed without finish(): the shards finished so far stay (a later write replaces or
    // removes them), but there is no manifest and no partial shard.
  }
  EXPECT_FALSE(fs::exists(dir / "out/manifest.json"));
  for (const auto& [name, bytes] : files_in(dir / "out")) {
    EXPECT_EQ(name.find(".partial"), std::string::npos) << name;
  }

  auto write_dataset = [&](int samples, bool overwrite) -> Status {
    ZW_ASSIGN_OR_RETURN(auto writer, DatasetWriter::create({.out_dir = dir / "out",
                                                            .shard_size = 4 << 10,
                                                            .overwrite = overwrite}));
    for (int i = 0; i < samples; ++i) {
      ZW_RETURN_IF_ERROR(
          write(*writer, {"k" + std::to_string(i), {{"bin", testing::random_bytes(3000, i)}}})
              .status());
    }
    return writer->finish().status();
  };
  ASSERT_TRUE(write_dataset(10, false).is_ok());
  const Status again = write_dataset(3, false);
  EXPECT_EQ(again.code(), ErrorCode::kAlreadyExists);
  EXPECT_NE(again.message().find("--overwrite"), std::string::npos) << again.message();
  EXPECT_EQ((*Dataset::open(dir / "out"))->size(), 10u);  // untouched

  ASSERT_TRUE(write_dataset(3, true).is_ok());
  EXPECT_EQ((*Dataset::open(dir / "out"))->size(), 3u);
  uint64_t shard_files = 0;
  for (const auto& [name, bytes] : files_in(dir / "out")) {
    shard_files += name.ends_with(format::kShardExtension);
  }
  EXPECT_EQ(shard_files, (*Dataset::open(dir / "out"))->shard_count());  // stale shards gone
}

TEST(DatasetWriter, AnOutputThatCannotBeUsedIsNamed) {
  TempDir dir;
  testing::write_file(dir / "file", "not a directory");
  auto in_file = DatasetWriter::create({.out_dir = dir / "file/out"});
  ASSERT_FALSE(in_file.is_ok());
  EXPECT_NE(in_file.status().message().find(dir / "file/out"), std::string::npos)
      << in_file.status().message();
  auto url = DatasetWriter::create({.out_dir = "file:///tmp/x"});
  EXPECT_EQ(url.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(DatasetWriter::create({.out_dir = dir / "x", .shard_size = 0}).status().code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerowait
