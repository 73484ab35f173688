// `zerowait cache status|warm DATASET`: how much of a dataset's shards the page cache holds, and
// reading the rest in before training starts.
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "host/memory_headroom.hpp"
#include "output.hpp"
#include "progress_bar.hpp"
#include "zerowait/host/page_cache.hpp"
#include "zerowait/storage/url.hpp"

namespace zerowait::cli {
namespace {

// What to do instead when given a URL.
constexpr const char* kRemoteCache =
    "the page cache holds local files; remote data is cached on local disk by the loader";

struct CacheArgs {
  std::string path;
  bool json = false;
  bool files = false;
  uint64_t max_bytes = 0;
};

// The dataset's shard files; remote ones are refused (their cache is --cache-dir's, on disk).
std::vector<std::string> shard_files(const std::string& path) {
  const std::shared_ptr<Dataset> ds = open_dataset(path);
  std::vector<std::string> files;
  for (size_t s = 0; s < ds->shard_count(); ++s) {
    const std::string& shard = ds->shard_path(s);
    if (is_url(shard)) {
      throw CliError("the page cache holds local files; '" + shard +
                     "' is remote (remote data is cached on local disk by the loader, by default)");
    }
    files.push_back(shard);
  }
  return files;
}

nlohmann::ordered_json residency_json(const Residency& r, bool files) {
  nlohmann::ordered_json out = {{"bytes", r.bytes},
                                {"resident_bytes", r.resident_bytes},
                                {"unmeasured_bytes", r.unmeasured_bytes},
                                {"resident_share", r.share()}};
  if (files) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const FileResidency& f : r.files) {
      list.push_back({{"path", f.path},
                      {"bytes", f.bytes},
                      {"resident_bytes", f.resident_bytes},
                      {"measured", f.measured}});
    }
    out["files"] = std::move(list);
  }
  return out;
}

std::string residency_percent(double share) {
  if (std::isnan(share)) return "unknown";
  return std::to_string(int(share * 100.0 + 0.5)) + " %";
}

std::string residency_text(const Residency& r) {
  return format_bytes(r.resident_bytes) + " of " + format_bytes(r.bytes) + " resident (" +
         residency_percent(r.share()) + ") in " + count_noun(r.files.size(), "shard", "shards") +
         (r.unmeasured_bytes == 0 ? ""
                                  : "; " + format_bytes(r.unmeasured_bytes) + " " +
                                        kUnmeasuredResidency + " (counted as not resident)");
}

int run_status(const CacheArgs& args) {
  const Residency r = unwrap(residency(shard_files(args.path)));
  if (args.json) {
    print_json({{"path", args.path}, {"residency", residency_json(r, args.files)}});
    return kExitOk;
  }
  if (args.files) {
    for (const FileResidency& f : r.files) {
      std::cout << f.path << ": " << format_bytes(f.resident_bytes) << " of "
                << format_bytes(f.bytes) << " (" << residency_percent(f.share()) << ")\n";
    }
  }
  std::cout << residency_text(r) << '\n';
  return kExitOk;
}

int run_warm(const CacheArgs& args) {
  const std::vector<std::string> files = shard_files(args.path);
  WarmOptions options;
  // By default at most half the memory available now: a warm-up past what memory holds only
  // evicts what it read first.
  const uint64_t available = available_memory_bytes();
  options.max_bytes = args.max_bytes != 0 ? args.max_bytes : available / 2;
  ProgressBar progress("warm", "");
  options.progress = [&](uint64_t done, uint64_t total) { progress.update(0, 0, done, total); };
  const WarmReport report = unwrap(warm_page_cache(files, options));
  progress.finish();
  if (args.json) {
    print_json({{"path", args.path},
                {"max_bytes", options.max_bytes},
                {"bytes_read", report.bytes_read},
                {"seconds", report.seconds},
                {"capped", report.capped},
                {"before", residency_json(report.before, false)},
                {"after", residency_json(report.after, args.files)}});
    return kExitOk;
  }
  std::cout << "read " << format_bytes(report.bytes_read) << " in "
            << format_duration(report.seconds) << " ("
            << format_rate(report.bytes_read, report.seconds) << "): "
            << residency_text(report.after) << ", was " << residency_percent(report.before.share())
            << '\n';
  if (report.capped) {
    std::cout << "note: stopped before " << format_bytes(options.max_bytes)
              << (args.max_bytes != 0
                      ? " (--max-bytes)"
                      : " (half the available memory: reading more would evict what was read)")
              << "; " << format_bytes(report.after.bytes - report.after.resident_bytes)
              << " not resident\n";
  }
  return kExitOk;
}

}  // namespace

Command add_cache_command(CLI::App& app) {
  auto args = std::make_shared<CacheArgs>();
  CLI::App* cache = app.add_subcommand(
      "cache", "Show how much of a dataset the page cache holds, or read it in (warm)");
  cache->require_subcommand(1);

  CLI::App* status =
      cache->add_subcommand("status", "Bytes of the dataset's shards in the page cache");
  add_dataset_argument(status, "PATH", &args->path)->check(local_path("PATH", kRemoteCache));
  status->add_flag("--files", args->files, "Also list each shard");
  add_json_flag(status, &args->json);
  status->footer(
      "Asks the kernel (mincore) which pages of each shard are in memory, as vmtouch does.\n"
      "An epoch over resident shards reads no disk.\n"
      "\n"
      "Example:\n"
      "  zerowait cache status /fast/train --files");

  CLI::App* warm = cache->add_subcommand(
      "warm", "Read the shards' pages that are not in the page cache, up to a budget");
  add_dataset_argument(warm, "PATH", &args->path)->check(local_path("PATH", kRemoteCache));
  add_size_option(warm, "--max-bytes", &args->max_bytes,
                  "Read at most this much (default: half the available memory)")
      ->default_str("MemAvailable / 2");
  warm->add_flag("--files", args->files, "With --json, list each shard's residency after");
  add_json_flag(warm, &args->json);
  warm->footer(
      "Reads only the 4 MiB chunks that hold a page not yet resident, shard by shard, in the\n"
      "dataset's order, and reports what it read, how long it took and the residency before\n"
      "and after. Run it before training (or while the job starts) so the first epoch is\n"
      "served from memory.\n"
      "\n"
      "Example:\n"
      "  zerowait cache warm /fast/train --max-bytes 64G");

  return {cache, [args, status, warm]() -> int {
            if (status->parsed()) return run_status(*args);
            if (warm->parsed()) return run_warm(*args);
            return kExitUsage;  // unreachable: require_subcommand(1)
          }};
}

}  // namespace zerowait::cli
