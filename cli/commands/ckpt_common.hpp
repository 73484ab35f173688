// What the `zerowait ckpt` subcommands share (defined in ckpt.cpp).
#pragma once

#include <memory>
#include <string>

#include "commands.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait::cli {

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

}  // namespace zerowait::cli
