// `zerowait verify PATH`: checks every shard against the manifest and every sample against its
// checksum.
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include "commands.hpp"
#include "output.hpp"
#include "progress_bar.hpp"

namespace zerowait::cli {
namespace {

struct VerifyArgs {
  std::string path;
  bool json = false;
};

struct BadShard {
  std::string shard;
  std::string reason;
};

struct BadSampleAt {
  std::string shard;
  BadSample sample;
};

struct VerifyResult {
  uint64_t shards = 0;
  uint64_t samples = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  std::vector<BadSampleAt> bad_samples;
  std::vector<BadShard> bad_shards;
  std::vector<std::string> structure_only;  // shards without checksums (WebDataset tars)

  bool ok() const { return bad_samples.empty() && bad_shards.empty(); }
};

void verify_shard(const Dataset& ds, size_t s, const std::function<void(uint64_t)>& on_bytes,
                  VerifyResult* result) {
  const std::string& path = ds.shard_path(s);
  // Opening checks the footer, the index checksum, and sizes and index checksum against the
  // manifest: a shard replaced after packing fails here.
  Result<std::shared_ptr<ShardReader>> opened = ds.shard(s);
  if (!opened) {
    result->bad_shards.push_back({path, opened.status().message()});
    return;
  }
  const ShardReader& reader = **opened;
  result->shards += 1;
  result->samples += reader.size();
  result->bytes += reader.source().size();
  if (!reader.has_checksums()) result->structure_only.push_back(path);
  Result<uint64_t> verified = reader.verify(
      [&](const BadSample& bad) {
        result->bad_samples.push_back({path, bad});
      },
      on_bytes);
  if (!verified) result->bad_shards.push_back({path, verified.status().message()});
}

nlohmann::ordered_json result_json(const std::string& path, const VerifyResult& r) {
  nlohmann::ordered_json bad_samples = nlohmann::ordered_json::array();
  for (const BadSampleAt& b : r.bad_samples) {
    bad_samples.push_back({{"shard", b.shard},
                           {"index", b.sample.index},
                           {"key", b.sample.key},
                           {"reason", b.sample.reason}});
  }
  nlohmann::ordered_json bad_shards = nlohmann::ordered_json::array();
  for (const BadShard& b : r.bad_shards) {
    bad_shards.push_back({{"shard", b.shard}, {"reason", b.reason}});
  }
  return {{"path", path},
          {"ok", r.ok()},
          {"shards", r.shards},
          {"samples", r.samples},
          {"bytes", r.bytes},
          {"seconds", r.seconds},
          {"bad_samples", std::move(bad_samples)},
          {"bad_shards", std::move(bad_shards)},
          {"structure_only", r.structure_only}};
}

void print_result(const VerifyResult& r) {
  for (const BadSampleAt& b : r.bad_samples) {
    std::cout << b.shard << '/' << b.sample.index << '/' << b.sample.key << ": " << b.sample.reason
              << '\n';
  }
  for (const BadShard& b : r.bad_shards) std::cout << b.shard << ": " << b.reason << '\n';
  for (const std::string& shard : r.structure_only) {
    std::cout << "note: " << shard
              << " is a WebDataset tar without checksums: only its structure was checked\n";
  }
  std::cout << (r.ok() ? "ok: " : "FAILED: ") << "verified "
            << count_noun(r.samples, "sample", "samples") << " in "
            << count_noun(r.shards, "shard", "shards") << " (" << format_bytes(r.bytes) << ") in "
            << format_duration(r.seconds) << ", " << format_rate(r.bytes, r.seconds) << ": "
            << count_noun(r.bad_samples.size(), "bad sample", "bad samples") << ", "
            << count_noun(r.bad_shards.size(), "bad shard", "bad shards") << '\n';
}

int run_verify(const VerifyArgs& args) {
  const auto start = std::chrono::steady_clock::now();
  VerifyResult result;
  Result<std::shared_ptr<Dataset>> opened = Dataset::open(args.path, dataset_options(args.path));
  if (opened) {
    const Dataset& ds = **opened;
    ProgressBar progress("verify", "");
    const uint64_t total = ds.manifest().bytes;
    uint64_t done = 0;
    auto on_bytes = [&](uint64_t bytes) { progress.update(0, 0, done += bytes, total); };
    for (size_t s = 0; s < ds.shard_count(); ++s) verify_shard(ds, s, on_bytes, &result);
  } else if (opened.status().code() == ErrorCode::kCorrupt) {
    // Finding corruption is what verify is for: a shard too damaged to open is a finding (exit
    // 3), not a failure of the command.
    result.bad_shards.push_back({args.path, opened.status().message()});
  } else {
    check(opened.status());
  }
  result.seconds = seconds_since(start);
  if (args.json) {
    print_json(result_json(args.path, result));
  } else {
    print_result(result);
  }
  return result.ok() ? kExitOk : kExitProblems;
}

}  // namespace

Command add_verify_command(CLI::App& app) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check every shard against the manifest and every sample against its checksum");
  add_dataset_argument(cmd, "PATH", &args->path);
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "Each bad sample is printed as SHARD/INDEX/KEY: REASON; the exit code is 3 when any\n"
      "sample or shard is bad. WebDataset tars carry no checksums: for them only the\n"
      "structure (headers, sizes) is checked.\n"
      "\n"
      "Example:\n"
      "  zerowait verify /fast/train --json");
  return {cmd, [args] { return run_verify(*args); }};
}

}  // namespace zerowait::cli
