// What the `zerowait ckpt` subcommands share (defined in ckpt.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait::cli {

// The arguments of ckpt ls, verify, inspect and gc.
struct CkptArgs {
  std::string dir;
  bool json = false;
  uint64_t step = 0;
  CLI::Option* step_option = nullptr;  // verify: whether STEP was given
  unsigned threads = 0;
  uint32_t rank = 0;
  CLI::Option* rank_option = nullptr;
  uint32_t keep_last = 0;
  uint64_t keep_every = 0;
  bool all_tmp = false;
};

// Throws a CliError saying which steps exist when `step` is not committed in `target` (`dir`).
void require_committed(Store& target, const std::string& dir, uint64_t step);
// The older steps a step references, as "3, 5" ("-" for none).
std::string references_text(const std::vector<uint64_t>& steps);
// `ckpt inspect` (ckpt_inspect.cpp).
int run_inspect(const CkptArgs& args);
// The checkpoint directory `dir` as a storage target; CliError when it does not exist or is not
// a directory.
std::shared_ptr<Store> open_checkpoint_directory(const std::string& dir);
// A subcommand's --help footer: what it does, its exit codes (`problems`: when it exits 3, or
// empty), and an example.
std::string help_footer(const std::string& description, const std::string& problems,
                        const std::string& example);
// Adds the required DIR positional.
void add_directory_argument(CLI::App* command, std::string* dir);
// Registers `ckpt restore` on the `ckpt` group (ckpt_restore.cpp).
Command add_ckpt_restore_command(CLI::App* ckpt);
// Registers `ckpt export` on the `ckpt` group (ckpt_export.cpp).
Command add_ckpt_export_command(CLI::App* ckpt);

}  // namespace zerowait::cli
