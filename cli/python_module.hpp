// Commands whose work lives in Python (torch.distributed, torch DataLoader, torch.save) run it by
// exec-ing `python -m zerowait.<module>` in an interpreter that has torch and zerowait. This is
// where that interpreter is found, probed and run, once for every such command.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace zerowait::cli {

// The options of `cmd` as the user gave them (after CLI11's checks and unit transforms), as
// `--name value` pairs for the Python module; options left out keep the module's defaults.
// Positionals (options without a leading dash) come first, bare.
std::vector<std::string> forwarded_args(const CLI::App& cmd);

// Replaces this process with `python -m module args...`. The interpreter is $ZEROWAIT_PYTHON,
// else the one that launched this command (`python -m zerowait` or the `zerowait` script of a
// pip install), else python3 on PATH; it is probed first for torch
// and `module`. `command` names the command in messages ("zerowait bench net") and `why` says
// why it needs Python ("torch.distributed"). Returns only by throwing CliError: no interpreter,
// torch or the module missing, or exec failed.
[[noreturn]] void exec_python_module(const std::string& module,
                                     const std::vector<std::string>& args,
                                     const std::string& command, const std::string& why);

}  // namespace zerowait::cli
