// A mistyped command: "zerowait doctr" is answered "unknown command 'doctr'; did you mean
// 'doctor'?" instead of CLI11's "A subcommand is required", which does not name the word.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace zerowait::cli {

// The message for the first word of argv that stands where `app` (or a command under it)
// expects a command and names none of them: the nearest command when one is close, else the
// list. nullopt when argv names known commands down to one that takes no further command.
std::optional<std::string> unknown_command_message(CLI::App& app, int argc, char** argv);

}  // namespace zerowait::cli
