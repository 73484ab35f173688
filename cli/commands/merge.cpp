// `zerowait merge OUT_DIR [PART_DIR...]`: joins the parts of `pack --part I/N` into one dataset
// manifest, OUT_DIR/manifest.json, without copying shards.
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "output.hpp"
#include "zerowait/shard/pack.hpp"

namespace zerowait::cli {
namespace {

struct MergeArgs {
  MergeOptions options;
  bool no_sync = false;
  bool json = false;
};

nlohmann::ordered_json report_json(const MergeReport& report, const MergeOptions& options) {
  nlohmann::ordered_json parts = nlohmann::ordered_json::array();
  for (const MergedPart& p : report.parts) {
    parts.push_back({{"index", p.index},
                     {"dir", p.dir},
                     {"samples", p.samples},
                     {"shards", p.shards},
                     {"bytes", p.bytes}});
  }
  return {{"out_dir", options.out_dir},      {"manifest", report.manifest_path},
          {"part_count", report.part_count}, {"samples", report.samples},
          {"shards", report.shards},         {"bytes", report.bytes},
          {"seconds", report.seconds},       {"parts", std::move(parts)}};
}

void print_report(const MergeReport& report) {
  std::cout << "merged " << count_noun(report.part_count, "part", "parts") << " ("
            << count_noun(report.samples, "sample", "samples") << ", "
            << count_noun(report.shards, "shard", "shards") << ", " << format_bytes(report.bytes)
            << ") in " << format_duration(report.seconds) << "; no shard was copied\n";
  print_key_values(std::cout, {{"  manifest", report.manifest_path}});
}

int run_merge(const MergeArgs& args) {
  MergeOptions options = args.options;
  options.sync = !args.no_sync;
  MergeReport report = unwrap(merge_parts(options));
  if (args.json) {
    print_json(report_json(report, options));
  } else {
    print_report(report);
  }
  return kExitOk;
}

}  // namespace

Command add_merge_command(CLI::App& app) {
  auto args = std::make_shared<MergeArgs>();
  MergeOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand(
      "merge", "Join the parts of `pack --part I/N` into one dataset, without copying shards");
  cmd->add_option("OUT_DIR", o.out_dir,
                  "The -o OUT_DIR the parts were packed into (a directory or "
                  "s3://BUCKET/PREFIX); manifest.json is written here")
      ->type_name("PATH")
      ->required();
  cmd->add_option("PART_DIR", o.parts,
                  "Part directories inside OUT_DIR (default: every OUT_DIR/part-IIII-of-NNNN)")
      ->type_name("PATH");
  cmd->add_flag("--whole-datasets", o.whole_datasets,
                "The PART_DIRs are datasets written on their own (zerowait.ray's write tasks), "
                "not parts of `pack --part I/N`: joined in the order given, no part record "
                "needed; every other check holds");
  cmd->add_flag("--overwrite", o.overwrite, "Replace an existing OUT_DIR/manifest.json");
  cmd->add_flag("--no-sync", args->no_sync, "Skip fsync (faster, not crash-safe)");
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "The merged manifest lists part 0's shards, then part 1's, ... by their paths inside\n"
      "OUT_DIR (part-0000-of-0004/shard-000000.zws), so the parts stay where they are. Before\n"
      "writing it, merge checks that every part 0..N-1 is there exactly once, that all were\n"
      "packed from the same input with the same options (same ImageFolder classes), that every\n"
      "shard matches its part's manifest and that no sample key is in two parts.\n"
      "\n"
      "Examples:\n"
      "  zerowait merge /shared/train\n"
      "  zerowait merge /shared/train /shared/train/part-0000-of-0002 "
      "/shared/train/part-0001-of-0002 --json\n"
      "  zerowait merge s3://my-bucket/train      # parts packed with -o s3://my-bucket/train\n"
      "  zerowait merge s3://my-bucket/ds s3://my-bucket/ds/ray-RUN/task-000000 ... "
      "--whole-datasets   # a failed zerowait.ray merge, again");
  return {cmd, [args] { return run_merge(*args); }};
}

}  // namespace zerowait::cli
