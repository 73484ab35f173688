// `zerowait pack SRC... -o OUT_DIR|s3://BUCKET/PREFIX [--part I/N]`: small files, ImageFolder
// trees and WebDataset tars into shards plus a manifest; with --part, one of N parts packed on N
// machines.
#include "zerowait/shard/pack.hpp"

#include <filesystem>
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
  std::string part;  // "I/N", empty without --part
  bool no_sync = false;
  bool json = false;
};

// Beside the manifest: in OUT_DIR, or in a part's directory.
std::string quarantine_path(const PackReport& report) {
  return (std::filesystem::path(report.manifest_path).parent_path() / format::kQuarantineName)
      .string();
}

bool is_part(const PackOptions& options) { return options.part_count > 1; }

nlohmann::ordered_json report_json(const PackReport& report, const PackOptions& options) {
  nlohmann::ordered_json quarantined = nlohmann::ordered_json::array();
  for (const QuarantineEntry& entry : report.quarantined) {
    quarantined.push_back({{"path", entry.path}, {"reason", entry.reason}});
  }
  nlohmann::ordered_json part = nullptr;
  if (is_part(options)) part = {{"index", options.part_index}, {"count", options.part_count}};
  return {{"out_dir", options.out_dir},
          {"part", std::move(part)},
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
                                  : nlohmann::ordered_json(quarantine_path(report))},
          {"quarantined", std::move(quarantined)}};
}

void print_report(const PackReport& report, const PackOptions& options) {
  if (is_part(options)) {
    std::cout << "part " << options.part_index << "/" << options.part_count << ": ";
  }
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
  if (is_part(options)) {
    std::cout << "  once all " << options.part_count << " parts are packed: zerowait merge "
              << options.out_dir << '\n';
  }
  if (report.quarantined.empty()) return;
  std::cout << "quarantined "
            << count_noun(report.quarantined.size(), "corrupt input", "corrupt inputs")
            << " (not packed; all listed in " << quarantine_path(report) << "):\n";
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
  if (!args.part.empty()) {
    check(parse_pack_part(args.part, &options.part_index, &options.part_count));
  }
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
  // A URL names an archive the storage layer reads (pack checks it there); a path must exist.
  const CLI::Validator existing_path_or_url(
      [](std::string& value) {
        return value.find("://") != std::string::npos ? std::string() : CLI::ExistingPath(value);
      },
      "PATH");
  cmd->add_option("SRC", o.sources,
                  "Input directories, .tar or .tar.gz/.tgz files; archives also at a URL the "
                  "storage layer reads (s3://BUCKET/KEY.tar, https://HOST/KEY.tar)")
      ->type_name("PATH")
      ->required()
      ->check(existing_path_or_url);
  cmd->add_option("-o,--output", o.out_dir,
                  "Output directory, or s3://BUCKET/PREFIX, for the shards and manifest.json")
      ->type_name("OUT_DIR")
      ->required();
  cmd->add_option("--tmp", o.tmp_dir,
                  "With an s3:// output: where each shard waits for its upload (about two "
                  "shards of space; default $TMPDIR, else /tmp)")
      ->type_name("DIR")
      ->check(local_path("--tmp"));
  cmd->add_flag("--imagefolder", o.imagefolder,
                "SRC is an ImageFolder tree: CLASS/NAME.ext -> fields ext and cls");
  add_size_option(cmd, "--shard-size", &o.shard_size, "Close a shard once it reaches this size");
  add_threads_option(cmd, &o.threads);
  cmd->add_flag("--align", o.align, "Start every sample on a 4 KiB boundary (O_DIRECT reads)");
  cmd->add_flag("--verify-images", o.verify_images,
                "Fully decode every JPEG/PNG, not only check its structure");
  cmd->add_option("--part", args->part,
                  "Pack only part I of N (0 <= I < N) into OUT_DIR/part-IIII-of-NNNN")
      ->type_name("I/N")
      ->check(CLI::Validator(
          [](std::string& text) {
            uint32_t index = 0, count = 0;
            return parse_pack_part(text, &index, &count).message();
          },
          ""));
  cmd->add_flag("--overwrite", o.overwrite, "Replace a dataset already in OUT_DIR");
  cmd->add_flag("--no-sync", args->no_sync, "Skip fsync (faster, not crash-safe)");
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "Files are grouped into samples by name: dir/0001.jpg + dir/0001.cls -> sample dir/0001\n"
      "with fields jpg and cls. Sizes accept 1024, 64K, 256M, 1G (K = 1024).\n"
      "Corrupt inputs are never packed: they are listed in OUT_DIR/quarantine.json and the\n"
      "command exits with 3.\n"
      "With --part I/N every part lists the whole input and packs its I-th of N contiguous\n"
      "ranges of about equal bytes (whole samples; a tar file is never split), so N machines\n"
      "with the same command line and input pack all of it once; ImageFolder class ids come\n"
      "from the whole input. `zerowait merge OUT_DIR` then writes OUT_DIR/manifest.json.\n"
      "With -o s3://BUCKET/PREFIX each shard is uploaded as soon as it is complete, under a\n"
      "hash-named key prefix (PREFIX/3f2a/shard-000042.zws) that spreads the request load, and\n"
      "manifest.json last; credentials and endpoint come from AWS_* variables or ~/.aws as for\n"
      "the AWS CLI. With --part too, part I goes to PREFIX/part-IIII-of-NNNN, and\n"
      "`zerowait merge s3://BUCKET/PREFIX` joins the parts there.\n"
      "\n"
      "Examples:\n"
      "  zerowait pack ~/data/imagenet/train -o /fast/train --imagefolder --shard-size 512M\n"
      "  zerowait pack shards/train-000*.tar -o /fast/train --json\n"
      "  zerowait pack ~/data/imagenet/train -o s3://my-bucket/imagenet/train --imagefolder\n"
      "  zerowait pack /data/train -o /shared/train --imagefolder \\\n"
      "      --part $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT   # in each array task\n"
      "  zerowait merge /shared/train                           # after the last one");
  return {cmd, [args] { return run_pack(*args); }};
}

}  // namespace zerowait::cli
