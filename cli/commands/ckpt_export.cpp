// `zerowait ckpt export DIR STEP --to safetensors -o FILE`: one committed step as one safetensors
// file of full, unsharded tensors (export_safetensors in src/checkpoint does the work).
#include <chrono>
#include <iostream>

#include "commands/ckpt_common.hpp"
#include "output.hpp"
#include "progress_bar.hpp"
#include "zerowait/checkpoint/export.hpp"

namespace zerowait::cli {
namespace {

using json = nlohmann::ordered_json;

constexpr const char* kExportDescription =
    "Writes one safetensors file holding the full tensors of a step: rank R's per-rank\n"
    "tensors (--rank, default 0) and every sharded (DTensor, FSDP) tensor assembled from\n"
    "the chunks all ranks saved. Every tensor and piece is checked against its xxh3 as it\n"
    "is read. Names are the key paths as JSON pointers (/model/layers.0.weight); --prefix\n"
    "/model/ keeps only those under /model/ and names them layers.0.weight. --dtype casts\n"
    "floating-point tensors (round to nearest even, as torch's .to()); other dtypes stay.\n"
    "The metadata holds the step and the run id. FILE appears only once complete.";

struct ExportArgs {
  std::string dir;
  uint64_t step = 0;
  std::string to;
  std::string output;
  std::string dtype = "saved";
  std::string prefix;
  uint32_t rank = 0;
  unsigned threads = 0;
  bool json = false;
};

ExportDtype parse_dtype(const std::string& name) {
  if (name == "bf16") return ExportDtype::kBFloat16;
  if (name == "fp16") return ExportDtype::kFloat16;
  if (name == "fp32") return ExportDtype::kFloat32;
  return ExportDtype::kAsSaved;
}

int run_export(const ExportArgs& args) {
  std::shared_ptr<Store> target = open_checkpoint_directory(args.dir);
  // A step that is not there, or a rank the step lacks, is a mistake on the command line.
  try {
    require_committed(*target, args.dir, args.step);
  } catch (const CliError& e) {
    std::cerr << "zerowait: error: " << e.what() << '\n';
    return kExitUsage;
  }
  ExportOptions options;
  options.rank = args.rank;
  options.prefix = args.prefix;
  options.dtype = parse_dtype(args.dtype);
  options.threads = args.threads;
  const auto start = std::chrono::steady_clock::now();
  Result<ExportReport> exported = [&] {
    ProgressBar progress("export", "");
    options.progress = [&](uint64_t done, uint64_t total) { progress.update(0, 0, done, total); };
    return export_safetensors(*target, args.step, args.output, options);
  }();
  const double seconds = seconds_since(start);
  if (!exported.is_ok()) {
    const Status& status = exported.status();
    std::cerr << "zerowait: error: " << status.message() << '\n';
    if (status.code() == ErrorCode::kInvalidArgument) return kExitUsage;
    return status.code() == ErrorCode::kCorrupt ? kExitProblems : kExitError;
  }
  const ExportReport& r = exported.value();
  size_t sharded = 0;
  for (const ExportedTensor& t : r.tensors) sharded += t.chunks > 0 ? 1 : 0;

  if (args.json) {
    json tensors = json::array();
    for (const ExportedTensor& t : r.tensors) {
      tensors.push_back({{"name", t.name},
                         {"dtype", t.dtype},
                         {"saved_dtype", t.saved_dtype},
                         {"shape", t.shape},
                         {"bytes", t.bytes},
                         {"chunks", t.chunks}});
    }
    print_json({{"path", target->describe()},
                {"step", r.step},
                {"run_id", r.run_id},
                {"world_size", r.world_size},
                {"rank", args.rank},
                {"file", args.output},
                {"file_bytes", r.file_bytes},
                {"bytes_read", r.bytes_read},
                {"tensors", std::move(tensors)},
                {"seconds", seconds}});
    return kExitOk;
  }
  std::cout << "ok: step " << r.step << " of " << target->describe() << " exported to "
            << args.output << ": " << count_noun(r.tensors.size(), "tensor", "tensors") << " ("
            << sharded << " assembled from shards), " << format_bytes(r.file_bytes) << "; "
            << format_bytes(r.bytes_read) << " read and verified in " << format_duration(seconds)
            << ", " << format_rate(r.bytes_read, seconds) << '\n';
  return kExitOk;
}

}  // namespace

Command add_ckpt_export_command(CLI::App* ckpt) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* command = ckpt->add_subcommand(
      "export", "Write a step's full (unsharded) tensors to one safetensors file");
  add_directory_argument(command, &args->dir);
  command->add_option("STEP", args->step, "Committed step to export")
      ->type_name("STEP")
      ->required()
      ->check(integer_at_least(0));
  command->add_option("--to", args->to, "Output format")
      ->type_name("FORMAT")
      ->required()
      ->check(CLI::IsMember({"safetensors"}));
  command->add_option("-o,--output", args->output, "The file to write")
      ->type_name("FILE")
      ->required();
  command
      ->add_option("--dtype", args->dtype,
                   "Cast floating-point tensors to bf16, fp16 or fp32 (default: as saved)")
      ->type_name("DTYPE")
      ->check(CLI::IsMember({"saved", "bf16", "fp16", "fp32"}));
  command->add_option("--rank", args->rank, "The rank whose per-rank tensors are exported")
      ->type_name("R")
      ->check(integer_at_least(0));
  command
      ->add_option("--prefix", args->prefix,
                   "Only key paths starting with P (a JSON pointer prefix), named without it")
      ->type_name("P");
  add_threads_option(command, &args->threads);
  add_json_flag(command, &args->json);
  command->footer(help_footer(
      kExportDescription, "a tensor or piece does not match its checksum (it is named)",
      "zerowait ckpt export /ckpt 1000 --to safetensors -o model.safetensors --dtype bf16 "
      "--prefix /model/"));
  return {command, [args] { return run_export(*args); }};
}

}  // namespace zerowait::cli
