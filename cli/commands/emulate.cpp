// `zerowait emulate WORKLOAD`: whether storage keeps N accelerators busy, by MLPerf Storage's
// rules (DLIO's accelerator utilisation), with zerowait's loader beside torch's DataLoader, and
// MLPerf's checkpointing workloads against torch.save. The comparison runs torch code (the
// DataLoader, torch.save), so this command checks its options and execs
// `python -m zerowait.emulate` with them (python/zerowait/emulate.py does the work).
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "output.hpp"
#include "python_module.hpp"

namespace zerowait::cli {
namespace {

constexpr const char* kEmulateModule = "zerowait.emulate";

// Values live in the Python module (its argparse defaults); these hold the parse only.
struct EmulateArgs {
  std::string workload, accelerator, input, shuffle, generate, data, out;
  unsigned accelerators = 0, workers = 0, steps = 0, seed = 0, max_accelerators = 0;
  unsigned checkpoints = 0;
  uint64_t samples = 0;
  double scale = 0, compute = 0;
  bool warm = false, find_max = false, json = false;
};

CLI::Validator scale_range() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const double value = std::stod(text, &used);
          if (used == text.size() && value > 0 && value <= 1) return {};
        } catch (const std::exception&) {
        }
        return "must be a number > 0 and <= 1, got '" + text + "'";
      },
      "");
}

const char* kEmulateFooter =
    "The method (MLPerf Storage, run by DLIO): each of N rank processes reads its partition of\n"
    "the data set in batches; the accelerator is replaced by a sleep of the workload's compute\n"
    "time per batch. Each step: t0, next batch, t1, sleep(compute), t2. AU (accelerator\n"
    "utilisation) per rank = compute / wall over every step but the first; the run's AU is the\n"
    "mean over ranks and passes when it reaches the workload's floor.\n"
    "\n"
    "Workloads (MLPerf Storage's DLIO configs; compute per batch for h100 / a100):\n"
    "  unet3d      samples of 146,600,628 +- 68,341,808 B, 1 per file; batch 7;\n"
    "              0.323 / 0.636 s; AU floor 90 %\n"
    "  resnet50    samples of 114,660 B, 1,251 per file; batch 400; 0.224 / 0.435 s; 90 %\n"
    "  cosmoflow   samples of 2,828,486 +- 71,311 B, 1 per file; batch 1;\n"
    "              0.0035 / 0.00551 s; AU floor 70 %\n"
    "  llama3-8b   checkpointing: 105 GB from 8 ranks; llama3-70b: 912 GB from 64 ranks; each\n"
    "              rank writes its share (fsync) and reads it back, beside torch.save + fsync\n"
    "\n"
    "--scale F shrinks sample sizes, sample counts and compute per batch by F (each accelerator\n"
    "still asks for the full workload's bytes per second); for checkpointing, the checkpoint.\n"
    "The unscaled data set follows MLPerf's size rule: 5x this host's memory, at least 500\n"
    "batches. Before each run its files are dropped from the page cache (posix_fadvise\n"
    "DONTNEED), since a scaled data set would fit in memory; --warm keeps them. What the cache\n"
    "held when each run began is then measured (mincore) and labels the run: evicted (<= 1 %\n"
    "resident), partial, or warm (>= 99 %; tmpfs stays warm whatever is evicted).\n"
    "\n"
    "--find-max doubles N from 1 until N misses the floor, then bisects. One run's verdict is\n"
    "noise near the floor, so each N runs twice; when the two verdicts differ, a third run\n"
    "decides (the majority of three). --input both judges zerowait's rows: the DataLoader's\n"
    "are the reference, and its missing the floor does not change the exit status.\n"
    "\n"
    "Runs python -m zerowait.emulate in $ZEROWAIT_PYTHON, else the python3 beside this\n"
    "executable, else python3 on PATH; it needs torch. Exit status 3 when a run misses its AU\n"
    "floor (with --find-max: when not even 1 accelerator meets it); 2 on a bad command line,\n"
    "such as --data or --generate naming a file instead of a directory.\n"
    "\n"
    "Examples:\n"
    "  zerowait emulate resnet50 --scale 0.05 --generate /data/emu    # make the data set\n"
    "  zerowait emulate resnet50 --data /data/emu --accelerators 4 --input both\n"
    "  zerowait emulate unet3d --data /data/u --accelerator a100 --find-max --out runs/u\n"
    "  zerowait emulate llama3-8b --scale 0.01 --accelerators 4 --data /data/ckpt";

}  // namespace

Command add_emulate_command(CLI::App& app) {
  auto args = std::make_shared<EmulateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "emulate", "MLPerf Storage emulation: how many accelerators the storage keeps busy");
  cmd->add_option("workload", args->workload, "unet3d, resnet50, cosmoflow, llama3-8b, llama3-70b")
      ->type_name("WORKLOAD")
      ->required()
      ->check(quiet(CLI::IsMember({"unet3d", "resnet50", "cosmoflow", "llama3-8b",
                                   "llama3-70b"})));
  cmd->add_option("--accelerator", args->accelerator, "Whose compute time per batch to emulate")
      ->type_name("h100|a100")
      ->check(quiet(CLI::IsMember({"h100", "a100"})))
      ->default_str("h100");
  cmd->add_option("--accelerators", args->accelerators,
                  "Rank processes (checkpointing: MLPerf's 8 / 64)")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("1");
  cmd->add_option("--scale", args->scale, "Shrink sample sizes, counts and compute by F")
      ->type_name("F")
      ->check(scale_range())
      ->default_str("1, or --data's");
  cmd->add_option("--generate", args->generate,
                  "Write the data set: DIR/zerowait (shards), DIR/files (plain)")
      ->type_name("DIR")
      ->check(local_path("--generate"));
  cmd->add_option("--data", args->data,
                  "Run on the data set --generate made (checkpointing: write there)")
      ->type_name("DIR")
      ->check(local_path("--data"));
  cmd->add_option("--input", args->input,
                  "zerowait.Loader, torch DataLoader over the plain files, or both")
      ->type_name("zerowait|files|both")
      ->check(quiet(CLI::IsMember({"zerowait", "files", "both"})))
      ->default_str("zerowait");
  cmd->add_option("--shuffle", args->shuffle,
                  "zerowait input: a uniform permutation, or blocks read whole")
      ->type_name("random|block")
      ->check(quiet(CLI::IsMember({"random", "block"})))
      ->default_str("random");
  cmd->add_option("--workers", args->workers,
                  "Loader threads / DataLoader workers per rank")
      ->type_name("N")
      ->check(integer_at_least(0))
      ->default_str("MLPerf's read_threads: 4, 8, 4");
  add_size_option(cmd, "--samples", &args->samples, "--generate this many samples")
      ->type_name("N")
      ->default_str("scaled MLPerf rule");
  cmd->add_option("--steps", args->steps, "At most N steps per rank (default: one epoch)")
      ->type_name("N")
      ->check(integer_at_least(1));
  cmd->add_option("--compute", args->compute, "Seconds of compute per batch instead")
      ->type_name("S")
      ->check(quiet(CLI::NonNegativeNumber));
  cmd->add_option("--seed", args->seed, "Seed of the data and the shuffle")
      ->type_name("N")
      ->check(integer_at_least(0))
      ->default_str("0");
  cmd->add_flag("--warm", args->warm, "Keep the data set in the page cache (no eviction)");
  cmd->add_flag("--find-max", args->find_max,
                "Find the most accelerators that meet the floor (each N runs twice; a third run "
                "decides when they disagree)");
  cmd->add_option("--max-accelerators", args->max_accelerators, "--find-max's bound")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("64");
  cmd->add_option("--checkpoints", args->checkpoints,
                  "Checkpointing: checkpoints written and read back")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("2");
  cmd->add_option("--out", args->out, "Write the run directory (docs/observe.md) to RUN")
      ->type_name("RUN")
      ->check(local_path("--out"));
  add_json_flag(cmd, &args->json);
  cmd->footer(kEmulateFooter);
  // Checked at parse time, so that a missing directory is a usage error (exit 2).
  cmd->callback([args]() {
    const bool checkpointing = args->workload.rfind("llama3", 0) == 0;
    if (checkpointing && args->data.empty()) {
      throw CLI::ValidationError("--data", args->workload + " writes its checkpoints into "
                                 "--data DIR; give one");
    }
    for (const auto& [name, path] : {std::pair<std::string, std::string>{"--data", args->data},
                                     {"--generate", args->generate}}) {
      std::error_code error;
      if (!path.empty() && std::filesystem::exists(path, error) &&
          !std::filesystem::is_directory(path, error)) {
        throw CLI::ValidationError(name, path +
                                             " is a file; give a directory (--generate "
                                             "makes it, --data runs on what --generate made)");
      }
    }
    if (!checkpointing && args->data.empty() && args->generate.empty()) {
      throw CLI::ValidationError("--data", "give --data DIR to run on a data set that "
                                 "--generate made, or --generate DIR to make one");
    }
  });
  return {cmd, [cmd]() -> int {
            exec_python_module(kEmulateModule, forwarded_args(*cmd), "zerowait emulate",
                               "torch DataLoader and torch.save as references");
          }};
}

}  // namespace zerowait::cli
