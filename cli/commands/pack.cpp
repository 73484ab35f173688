// `zerowait pack SRC... -o OUT_DIR`: small files, ImageFolder trees and WebDataset tars into
// shards plus a manifest.
#include "zerowait/shard/pack.hpp"

#include <iostream>
#include <memory>

#include "commands.hpp"
#include "output.hpp"
#include "progress_bar.hpp"
#include "zerowait/shard/format.hpp"

namespace zerowait::cli {
namespace {

// How many quarantined inputs the human summary lists; quarantine.json has all of them.
constexpr size_t kQuarantineShown = 5;

struct PackArgs {
  PackOptions options;
  bool no_sync = false;
  bool json = false;
};

std::string quarantine_path(const PackOptions& options) {
  return options.out_dir + "/" + format::kQuarantineName;
}

nlohmann::ordered_json report_json(const PackReport& report, const PackOptions& options) {
  nlohmann::ordered_json quarantined = nlohmann::ordered_json::array();
  for (const QuarantineEntry& entry : report.quarantined) {
    quarantined.push_back({{"path", entry.path}, {"reason", entry.reason}});
  }
  return {{"out_dir", options.out_dir},
          {"manifest", report.manifest_path},
          {"samples", report.samples},
          {"files", report.files},
          {"ignored", report.ignored},
          {"shards", report.shards},
          {"bytes_in", report.bytes_in},
          {"bytes_out", report.bytes_out},
          {"seconds", report.seconds},
          {"quarantine_file", report.quarantined.empty()
                                  ? nlohmann::ordered_json(nullptr)
                                  : nlohmann::ordered_json(quarantine_path(options))},
          {"quarantined", std::move(quarantined)}};
}

void print_report(const PackReport& report, const PackOptions& options) {
  std::cout << "packed " << count_noun(report.samples, "sample", "samples") << " from "
            << count_noun(report.files, "file", "files") << " into "
            << count_noun(report.shards, "shard", "shards") << " in "
            << format_duration(report.seconds) << '\n';
  print_key_values(std::cout, {{"  in", format_bytes(report.bytes_in)},
                               {"  out", format_bytes(report.bytes_out)},
                               {"  speed", format_rate(report.bytes_in, report.seconds)},
                               {"  manifest", report.manifest_path}});
  if (report.ignored > 0) {
    std::cout << "  ignored " << count_noun(report.ignored, "entry", "entries")
              << " that are not sample files (no extension, directories, links)\n";
  }
  if (report.quarantined.empty()) return;
  std::cout << "quarantined "
            << count_noun(report.quarantined.size(), "corrupt input", "corrupt inputs")
            << " (not packed; all listed in " << quarantine_path(options) << "):\n";
  for (size_t i = 0; i < report.quarantined.size() && i < kQuarantineShown; ++i) {
    std::cout << "  " << report.quarantined[i].path << ": " << report.quarantined[i].reason << '\n';
  }
  if (report.quarantined.size() > kQuarantineShown) {
    std::cout << "  ... and " << report.quarantined.size() - kQuarantineShown << " more\n";
  }
}

int run_pack(const PackArgs& args) {
  PackOptions options = args.options;
  options.sync = !args.no_sync;
  ProgressBar progress("pack", "files");
  options.on_progress = [&progress](const PackProgress& p) {
    progress.update(p.files_done, p.files_total, p.bytes_done, p.bytes_total);
  };
  PackReport report = unwrap(pack(options));
  progress.finish();
  if (args.json) {
    print_json(report_json(report, options));
  } else {
    print_report(report, options);
  }
  return report.quarantined.empty() ? kExitOk : kExitProblems;
}

}  // namespace

Command add_pack_command(CLI::App& app) {
  auto args = std::make_shared<PackArgs>();
  PackOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand(
      "pack", "Pack directories of small files and WebDataset tars into indexed shards");
  cmd->add_option("SRC", o.sources, "Input directories, .tar or .tar.gz/.tgz files")
      ->type_name("PATH")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("-o,--output", o.out_dir, "Output directory for the shards and manifest.json")
      ->type_name("OUT_DIR")
      ->required();
  cmd->add_flag("--imagefolder", o.imagefolder,
                "SRC is an ImageFolder tree: CLASS/NAME.ext -> fields ext and cls");
  add_size_option(cmd, "--shard-size", &o.shard_size, "Close a shard once it reaches this size");
  add_threads_option(cmd, &o.threads);
  cmd->add_flag("--align", o.align, "Start every sample on a 4 KiB boundary (O_DIRECT reads)");
  cmd->add_flag("--verify-images", o.verify_images,
                "Fully decode every JPEG/PNG, not only check its structure");
  cmd->add_flag("--overwrite", o.overwrite, "Replace a dataset already in OUT_DIR");
  cmd->add_flag("--no-sync", args->no_sync, "Skip fsync (faster, not crash-safe)");
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "Files are grouped into samples by name: dir/0001.jpg + dir/0001.cls -> sample dir/0001\n"
      "with fields jpg and cls. Sizes accept 1024, 64K, 256M, 1G (K = 1024).\n"
      "Corrupt inputs are never packed: they are listed in OUT_DIR/quarantine.json and the\n"
      "command exits with 3.\n"
      "\n"
      "Examples:\n"
      "  zerowait pack ~/data/imagenet/train -o /fast/train --imagefolder --shard-size 512M\n"
      "  zerowait pack shards/train-000*.tar -o /fast/train --json");
  return {cmd, [args] { return run_pack(*args); }};
}

}  // namespace zerowait::cli
