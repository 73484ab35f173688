// The `zerowait` command, run as a real subprocess: output, JSON, exit codes and files written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/testing.hpp"
#include "zerowait/shard/reader.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::make_jpeg;
using testing::read_file;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

using Json = nlohmann::json;

// Every regular file under `root`, by '/'-separated relative path, with its bytes.
std::map<std::string, std::string> read_tree(const std::string& root) {
  std::map<std::string, std::string> tree;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    tree[fs::relative(entry.path(), root).generic_string()] = read_file(entry.path().string());
  }
  return tree;
}

Json parse_json(const CommandResult& r) {
  Json j = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON:\n" << r.out;
  return j;
}

std::string describe(const CommandResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

// A tree of samples grouped by basename, with fields that pack does not image-check except jpg.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(src_ / "cats/0001.jpg", make_jpeg(32, 24, 1));
    write_file(src_ / "cats/0001.json", R"({"label": "cat"})");
    write_file(src_ / "cats/0002.jpg", make_jpeg(40, 16, 2));
    write_file(src_ / "cats/0002.json", R"({"label": "cat", "n": 2})");
    write_file(src_ / "dogs/0003.jpg", make_jpeg(16, 16, 3));
    write_file(src_ / "dogs/0003.seg.txt", "segmentation of 0003");
    write_file(src_ / "0004.bin", testing::random_bytes(300 * 1024, 4));
  }

  // Packs src_ into out_ and checks the command succeeded.
  void pack(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"pack", src_.path(), "-o", out_.path(), "--no-sync"};
    args.insert(args.end(), extra.begin(), extra.end());
    CommandResult r = run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
  }

  std::string only_shard() const {
    std::vector<std::string> shards;
    for (const auto& e : fs::directory_iterator(out_.path())) {
      if (e.path().extension() == ".zws") shards.push_back(e.path().string());
    }
    EXPECT_EQ(shards.size(), 1u);
    return shards.empty() ? "" : shards[0];
  }

  static constexpr int kSamples = 4;
  TempDir src_;
  TempDir out_;
  TempDir work_;
};

TEST_F(CliTest, HelpListsCommandsAndExitCodes) {
  CommandResult r = run_cli({"--help"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (const char* word :
       {"pack", "inspect", "verify", "cat", "unpack", "generate", "Exit codes"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word;
  }
}

TEST_F(CliTest, EveryCommandHelpHasAnExample) {
  for (std::vector<std::string> command : {std::vector<std::string>{"pack"},
                                           {"inspect"},
                                           {"verify"},
                                           {"cat"},
                                           {"unpack"},
                                           {"generate", "imagefolder"}}) {
    command.push_back("--help");
    CommandResult r = run_cli(command);
    EXPECT_EQ(r.exit_code, 0) << command[0] << "\n" << describe(r);
    EXPECT_NE(r.out.find("Example"), std::string::npos) << command[0];
  }
}

TEST_F(CliTest, VersionPrintsTheVersion) {
  CommandResult r = run_cli({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("zerowait ", 0), 0u) << r.out;
}

TEST_F(CliTest, UsageErrorsExitWith2) {
  CommandResult unknown = run_cli({"pack", src_.path(), "-o", out_.path(), "--bogus"});
  EXPECT_EQ(unknown.exit_code, 2) << describe(unknown);
  EXPECT_NE(unknown.err.find("--bogus"), std::string::npos) << unknown.err;

  EXPECT_EQ(run_cli({}).exit_code, 2);
  EXPECT_EQ(run_cli({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(run_cli({"pack", src_.path()}).exit_code, 2);  // -o is required
  EXPECT_EQ(run_cli({"pack", src_.path(), "-o", out_.path(), "--shard-size", "12Q"}).exit_code, 2);
  EXPECT_EQ(run_cli({"pack", src_.path(), "-o", out_.path(), "--shard-size", "0"}).exit_code, 2);
  EXPECT_EQ(run_cli({"cat", out_.path(), "-1"}).exit_code, 2);
  EXPECT_EQ(run_cli({"generate", "imagefolder", work_.path(), "--files", "0"}).exit_code, 2);
}

TEST_F(CliTest, MissingPathIsAnErrorNamingThePath) {
  const std::string missing = work_ / "no-such-dataset";
  for (std::vector<std::string> command : {std::vector<std::string>{"inspect", missing},
                                           {"verify", missing},
                                           {"cat", missing, "0"},
                                           {"unpack", missing, "-o", work_ / "x"}}) {
    CommandResult r = run_cli(command);
    EXPECT_EQ(r.exit_code, 1) << command[0] << "\n" << describe(r);
    EXPECT_EQ(r.err.rfind("zerowait: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  }
}

TEST_F(CliTest, PackPrintsASummaryAndStaysQuietOnAPipe) {
  CommandResult r = run_cli({"pack", src_.path(), "-o", out_.path(), "--no-sync"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("packed 4 samples"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("manifest.json"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");  // no progress bar when stderr is not a terminal
  EXPECT_TRUE(fs::exists(out_ / "manifest.json"));

  CommandResult again = run_cli({"pack", src_.path(), "-o", out_.path(), "--no-sync"});
  EXPECT_EQ(again.exit_code, 1) << describe(again);
  EXPECT_EQ(run_cli({"pack", src_.path(), "-o", out_.path(), "--no-sync", "--overwrite"}).exit_code,
            0);
}

TEST_F(CliTest, PackJsonReportsTheCounts) {
  CommandResult r = run_cli(
      {"pack", src_.path(), "-o", out_.path(), "--no-sync", "--json", "--shard-size", "64K"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  Json j = parse_json(r);
  EXPECT_EQ(j["samples"], kSamples);
  EXPECT_EQ(j["files"], 7);
  EXPECT_GE(j["shards"].get<int>(), 2);  // 64K shards cannot hold the 300 KiB sample and the rest
  EXPECT_GT(j["bytes_out"].get<uint64_t>(), j["bytes_in"].get<uint64_t>());
  EXPECT_TRUE(j["quarantined"].empty());
}

TEST_F(CliTest, PackQuarantinesATruncatedJpegAndExitsWith3) {
  const std::string jpeg = make_jpeg(64, 64, 9);
  write_file(src_ / "dogs/0005.jpg", jpeg.substr(0, jpeg.size() / 2));
  CommandResult r = run_cli({"pack", src_.path(), "-o", out_.path(), "--no-sync"});
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_NE(r.out.find("0005.jpg"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quarantine.json"), std::string::npos) << r.out;
  const std::string quarantine = read_file(out_ / "quarantine.json");
  EXPECT_FALSE(Json::parse(quarantine, nullptr, false).is_discarded());
  EXPECT_NE(quarantine.find("dogs/0005.jpg"), std::string::npos) << quarantine;

  CommandResult json =
      run_cli({"pack", src_.path(), "-o", out_.path(), "--no-sync", "--overwrite", "--json"});
  EXPECT_EQ(json.exit_code, 3) << describe(json);
  Json j = parse_json(json);
  ASSERT_EQ(j["quarantined"].size(), 1u);
  EXPECT_NE(j["quarantined"][0]["path"].get<std::string>().find("0005.jpg"), std::string::npos);
  EXPECT_EQ(j["samples"], kSamples);
}

TEST_F(CliTest, GenerateThenPackImageFolder) {
  const std::string images = work_ / "images";
  CommandResult gen = run_cli({"generate", "imagefolder", images, "--files", "12", "--classes", "3",
                               "--seed", "5", "--min-bytes", "2K", "--max-bytes", "8K"});
  ASSERT_EQ(gen.exit_code, 0) << describe(gen);
  EXPECT_NE(gen.out.find("12 JPEG files"), std::string::npos) << gen.out;

  CommandResult packed =
      run_cli({"pack", images, "-o", out_.path(), "--imagefolder", "--no-sync", "--json"});
  ASSERT_EQ(packed.exit_code, 0) << describe(packed);
  EXPECT_EQ(parse_json(packed)["samples"], 12);

  CommandResult inspect = run_cli({"inspect", out_.path(), "--json"});
  ASSERT_EQ(inspect.exit_code, 0) << describe(inspect);
  Json j = parse_json(inspect);
  EXPECT_EQ(j["samples"], 12);
  EXPECT_EQ(j["classes"].size(), 3u);
  EXPECT_EQ(j["fields"], Json::array({"cls", "jpg"}));

  EXPECT_EQ(run_cli({"generate", "imagefolder", images, "--min-bytes", "9K", "--max-bytes", "8K"})
                .exit_code,
            1);
}

TEST_F(CliTest, InspectShowsDatasetAndShardDetails) {
  pack({"--align"});
  CommandResult human = run_cli({"inspect", out_.path(), "--shards"});
  ASSERT_EQ(human.exit_code, 0) << describe(human);
  EXPECT_NE(human.out.find("samples:"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("bin, jpg, json, seg.txt"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find(".zws"), std::string::npos) << human.out;  // the shard table

  CommandResult shard = run_cli({"inspect", only_shard(), "--json", "--shards"});
  ASSERT_EQ(shard.exit_code, 0) << describe(shard);
  Json j = parse_json(shard);
  EXPECT_EQ(j["samples"], kSamples);
  EXPECT_EQ(j["format"]["kind"], "zerowait");
  EXPECT_EQ(j["format"]["version"], 1);
  EXPECT_EQ(j["format"]["aligned"], true);
  EXPECT_EQ(j["format"]["checksums"], true);
  EXPECT_EQ(j["shards"].size(), 1u);
}

TEST_F(CliTest, CatWritesFieldBytesIdenticalToTheSource) {
  pack();
  int checked = 0;
  for (int i = 0; i < kSamples; ++i) {
    CommandResult listing = run_cli({"cat", out_.path(), std::to_string(i)});
    ASSERT_EQ(listing.exit_code, 0) << describe(listing);
    const size_t at = listing.out.find("key:");
    ASSERT_NE(at, std::string::npos) << listing.out;
    const size_t begin = listing.out.find_first_not_of(' ', at + 4);
    const std::string key = listing.out.substr(begin, listing.out.find('\n', at) - begin);
    for (const char* field : {"jpg", "bin", "seg.txt"}) {
      const std::string source = src_ / (key + "." + field);
      if (!fs::exists(source)) continue;
      EXPECT_NE(listing.out.find(field), std::string::npos) << listing.out;
      CommandResult bytes = run_cli({"cat", out_.path(), std::to_string(i), "--field", field});
      ASSERT_EQ(bytes.exit_code, 0) << describe(bytes);
      EXPECT_TRUE(bytes.out == read_file(source)) << key << "." << field;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 5);  // 3 jpg, 1 bin, 1 seg.txt
}

TEST_F(CliTest, CatNamesTheValidRangeAndTheFields) {
  pack();
  CommandResult range = run_cli({"cat", out_.path(), "4"});
  EXPECT_EQ(range.exit_code, 1);
  EXPECT_NE(range.err.find("valid: 0..3"), std::string::npos) << range.err;

  CommandResult field = run_cli({"cat", out_.path(), "0", "--field", "nope"});
  EXPECT_EQ(field.exit_code, 1);
  EXPECT_NE(field.err.find("'nope'"), std::string::npos) << field.err;
}

TEST_F(CliTest, CatIntoAClosedPipeIsQuiet) {
  // The CLI is built beside the tests directory (CMake's layout); run it through a shell so
  // stdout is a pipe that `head` closes after one byte, long before the 4 MiB field is out.
  const fs::path cli = fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "zerowait";
  if (!fs::exists(cli) || !fs::exists("/bin/bash")) GTEST_SKIP() << "no " << cli << " or bash";
  write_file(work_ / "big/only.bin", testing::random_bytes(4 << 20, 7));
  ASSERT_EQ(run_cli({"pack", work_ / "big", "-o", out_.path(), "--no-sync"}).exit_code, 0);
  const std::string pipeline = "\"" + cli.string() + "\" cat '" + out_.path() +
                               "' 0 --field bin | head -c 1 >/dev/null; exit ${PIPESTATUS[0]}";
  CommandResult r = testing::run_command({"/bin/bash", "-c", pipeline});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.err, "");
}

TEST_F(CliTest, UnpackRoundTripsTheSourceTree) {
  pack({"--shard-size", "64K"});
  const std::string unpacked = work_ / "unpacked";
  CommandResult r = run_cli({"unpack", out_.path(), "-o", unpacked});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(read_tree(unpacked), read_tree(src_.path()));

  CommandResult again = run_cli({"unpack", out_.path(), "-o", unpacked});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("already exists"), std::string::npos) << again.err;
  EXPECT_EQ(run_cli({"unpack", out_.path(), "-o", unpacked, "--overwrite"}).exit_code, 0);
  EXPECT_EQ(read_tree(unpacked), read_tree(src_.path()));
}

TEST_F(CliTest, UnpackRefusesATarWithADotDotMember) {
  write_file(work_ / "in/x/evil.txt", "escaped");
  write_file(work_ / "in/x/evil.cls", "1");
  const std::string tar = work_ / "evil.tar";
  CommandResult made =
      testing::run_command({"/usr/bin/tar", "-cf", tar, "-C", work_ / "in", "--transform",
                            "s,^x/,../,", "x/evil.txt", "x/evil.cls"});
  if (made.exit_code != 0) GTEST_SKIP() << "system tar failed: " << made.err;

  const std::string dest = work_ / "dest/inner";
  CommandResult r = run_cli({"unpack", tar, "-o", dest});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("'../evil'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(work_ / "dest/evil.txt"));
  EXPECT_FALSE(fs::exists(dest));  // refused before anything was written
}

TEST_F(CliTest, VerifyPassesOnAGoodDataset) {
  pack();
  CommandResult r = run_cli({"verify", out_.path()});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("ok: verified 4 samples"), std::string::npos) << r.out;
  CommandResult json = run_cli({"verify", out_.path(), "--json"});
  EXPECT_EQ(json.exit_code, 0);
  Json j = parse_json(json);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["samples"], kSamples);
  EXPECT_TRUE(j["bad_samples"].empty());
}

TEST_F(CliTest, VerifyNamesAFlippedByteAndExitsWith3) {
  pack();
  const std::string shard = only_shard();
  uint64_t offset = 0;
  std::string key;
  {
    auto reader = ShardReader::open_path(shard);
    ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
    offset = (*reader)->index().samples[2].offset + 7;
    key = std::string((*reader)->key(2));
  }
  std::string bytes = read_file(shard);
  bytes[offset] = static_cast<char>(bytes[offset] ^ 0x20);
  write_file(shard, bytes);

  CommandResult r = run_cli({"verify", out_.path()});
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_NE(r.out.find(shard + "/2/" + key + ": checksum mismatch"), std::string::npos) << r.out;

  CommandResult json = run_cli({"verify", shard, "--json"});
  EXPECT_EQ(json.exit_code, 3);
  Json j = parse_json(json);
  EXPECT_EQ(j["ok"], false);
  ASSERT_EQ(j["bad_samples"].size(), 1u);
  EXPECT_EQ(j["bad_samples"][0]["index"], 2);
  EXPECT_EQ(j["bad_samples"][0]["key"], key);

  // Reading the damaged sample fails loudly too.
  EXPECT_EQ(run_cli({"cat", out_.path(), "2", "--field", "jpg"}).exit_code, 1);
}

TEST_F(CliTest, VerifyReportsAShardReplacedAfterPacking) {
  pack();
  write_file(src_ / "cats/0001.json", R"({"label": "dog"})");  // same size, other bytes
  const std::string other = work_ / "other";
  ASSERT_EQ(run_cli({"pack", src_.path(), "-o", other, "--no-sync"}).exit_code, 0);
  const std::string shard = only_shard();
  fs::copy_file(other + "/" + fs::path(shard).filename().string(), shard,
                fs::copy_options::overwrite_existing);

  CommandResult r = run_cli({"verify", out_.path()});
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_NE(r.out.find(shard + ": "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 bad shard"), std::string::npos) << r.out;
}

TEST_F(CliTest, VerifyOfATarSaysOnlyStructureWasChecked) {
  write_file(work_ / "in/0001.txt", "hello");
  write_file(work_ / "in/0001.cls", "3");
  const std::string tar = work_ / "data.tar";
  CommandResult made = testing::run_command(
      {"/usr/bin/tar", "-cf", tar, "-C", work_ / "in", "0001.txt", "0001.cls"});
  if (made.exit_code != 0) GTEST_SKIP() << "system tar failed: " << made.err;
  CommandResult r = run_cli({"verify", tar});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("only its structure was checked"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace zerowait
