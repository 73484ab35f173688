// `zerowait generate imagefolder DIR`: a synthetic ImageFolder tree of real JPEGs, for the quick
// start, benchmarks and tests.
#include <chrono>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "output.hpp"
#include "progress_bar.hpp"
#include "zerowait/shard/synthetic.hpp"

namespace zerowait::cli {
namespace {

int run_generate_imagefolder(const SyntheticImageFolderOptions& args) {
  if (args.min_bytes > args.max_bytes) {
    throw CliError("--min-bytes (" + std::to_string(args.min_bytes) +
                   ") is larger than --max-bytes (" + std::to_string(args.max_bytes) + ")");
  }
  SyntheticImageFolderOptions options = args;
  ProgressBar progress("generate", "files");
  options.on_progress = [&progress](uint64_t done, uint64_t total) {
    progress.update(done, total, 0, 0);
  };
  const auto start = std::chrono::steady_clock::now();
  const SyntheticReport report = unwrap(generate_imagefolder(options));
  const double seconds = seconds_since(start);
  progress.finish();
  std::cout << "generated " << report.files << " JPEG files (" << format_bytes(report.bytes)
            << ") in " << options.classes << " classes under " << options.out_dir << " in "
            << format_duration(seconds) << '\n';
  return kExitOk;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  CLI::App* generate = app.add_subcommand("generate", "Generate synthetic datasets");
  generate->require_subcommand(1);

  auto args = std::make_shared<SyntheticImageFolderOptions>();
  CLI::App* cmd = generate->add_subcommand(
      "imagefolder", "Write DIR/class_XXX/img_XXXXXXXX.jpg: real, decodable JPEGs");
  cmd->add_option("DIR", args->out_dir, "Output directory (created if missing)")
      ->check(local_path("DIR"))
      ->required();
  cmd->add_option("--files", args->files, "Number of JPEG files")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->capture_default_str();
  cmd->add_option("--classes", args->classes, "Number of class directories")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Random seed: the same seed gives the same bytes")
      ->type_name("N")
      ->capture_default_str();
  add_size_option(cmd, "--min-bytes", &args->min_bytes, "Smallest file size");
  add_size_option(cmd, "--max-bytes", &args->max_bytes, "Largest file size");
  add_threads_option(cmd, &args->threads);
  cmd->footer(
      "Example:\n"
      "  zerowait generate imagefolder /tmp/synthetic --files 20000 --classes 100 --seed 7");
  return {cmd, [args] { return run_generate_imagefolder(*args); }};
}

}  // namespace zerowait::cli
