// The subcommands of `zerowait`. Each add_*_command registers its options on `app` and returns
// what to run when the user chose it; main() dispatches and owns the error handling.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

namespace zerowait::cli {

struct Command {
  CLI::App* app = nullptr;  // the subcommand's parser (owned by the parent app)
  // Runs the command after a successful parse. Returns an exit code (kExitOk or
  // kExitProblems); failures throw CliError.
  std::function<int()> run;
};

Command add_pack_command(CLI::App& app);
// `zerowait merge`: joins the parts of `pack --part I/N`.
Command add_merge_command(CLI::App& app);
Command add_inspect_command(CLI::App& app);
Command add_verify_command(CLI::App& app);
Command add_cat_command(CLI::App& app);
Command add_unpack_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
// `zerowait ckpt ls|verify|inspect|gc`: one Command whose run() dispatches to the chosen one.
Command add_ckpt_command(CLI::App& app);
// `zerowait cache status|warm`: the page cache's share of a dataset, and a bounded warm-up.
Command add_cache_command(CLI::App& app);
// `zerowait doctor [PATH...]`: system settings that make training wait, with evidence and fixes.
Command add_doctor_command(CLI::App& app);
// `zerowait bench storage|files|net`: one Command whose run() dispatches to the chosen one.
Command add_bench_command(CLI::App& app);
// The `bench` subcommands, each registered on `bench` by its own file (cli/commands/bench_*.cpp).
Command add_bench_storage_command(CLI::App& bench);
Command add_bench_files_command(CLI::App& bench);
Command add_bench_net_command(CLI::App& bench);
// `zerowait emulate WORKLOAD`: MLPerf Storage emulation, run by python -m zerowait.emulate.
Command add_emulate_command(CLI::App& app);
// `zerowait report RUN`: a run directory drawn as one self-contained HTML page.
Command add_report_command(CLI::App& app);
// `zerowait plan --nodes N ...`: an N-node job's load on the object store, from the real plan.
Command add_plan_command(CLI::App& app);
// `zerowait watch (--pid PID | -- CMD)`: where a running job's time goes, seen from outside.
Command add_watch_command(CLI::App& app);

// Returns `validator` without its description, for options whose type_name says it better.
CLI::Validator quiet(CLI::Validator validator);
// Accepts only decimal integers >= `min` (after any unit transform), with a plain message. CLI11
// alone would wrap "-1" into a huge unsigned value.
CLI::Validator integer_at_least(uint64_t min);
// Refuses a URL where only a local path works (a usage error, exit 2): "<what>: <text> is a URL;
// <what> must be a local path (<fix>)". `what` is the option's name as CLI11 gives it ("--out",
// "PATH"), which CLI11 puts first.
CLI::Validator local_path(std::string what, std::string fix = "");
// Adds "--threads N" (0 = one per CPU), shared by pack and generate.
CLI::Option* add_threads_option(CLI::App* command, unsigned* threads);
// Adds a byte-size option that accepts 1024, 64K, 256M, 1G (binary multiples); a bad value is a
// usage error.
CLI::Option* add_size_option(CLI::App* command, const std::string& name, uint64_t* bytes,
                             const std::string& description);
// Adds the required positional that names a dataset: a manifest.json, a directory holding one, a
// directory of .zws/.tar shards, or one shard file.
CLI::Option* add_dataset_argument(CLI::App* command, const std::string& name, std::string* path);
// Adds "--json" (machine-readable output on stdout).
CLI::Option* add_json_flag(CLI::App* command, bool* json);

}  // namespace zerowait::cli
