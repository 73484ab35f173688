// `zerowait`: the command-line tool. Parsing, dispatch and the single place where errors become
// a message and an exit code; every command's logic lives in the library.
#include <charconv>
#include <csignal>
#include <exception>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "output.hpp"
#include "unknown_command.hpp"
#include "zerowait/storage/url.hpp"

namespace zerowait::cli {

CLI::Validator quiet(CLI::Validator validator) { return validator.description(""); }

CLI::Validator integer_at_least(uint64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        uint64_t value = 0;
        const char* end = text.data() + text.size();
        auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error != std::errc() || stop != end || value < min) {
          return "must be an integer >= " + std::to_string(min) + ", got '" + text + "'";
        }
        return {};
      },
      "");
}

namespace {

// 268435456 -> "256M": defaults in --help read the way users type them.
std::string size_text(uint64_t bytes) {
  static constexpr const char* kSuffixes[] = {"", "K", "M", "G", "T"};
  size_t unit = 0;
  while (bytes != 0 && bytes % 1024 == 0 && unit + 1 < std::size(kSuffixes)) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kSuffixes[unit];
}

}  // namespace

CLI::Option* add_threads_option(CLI::App* command, unsigned* threads) {
  return command->add_option("--threads", *threads, "Worker threads (0 = one per CPU)")
      ->type_name("N")
      ->check(quiet(CLI::Range(0u, 4096u)))
      ->capture_default_str();
}

CLI::Option* add_size_option(CLI::App* command, const std::string& name, uint64_t* bytes,
                             const std::string& description) {
  // CLI11's own unit parser: 1024, 64K, 256M, 1G, also "256MiB"; K means 1024 throughout.
  return command->add_option(name, *bytes, description)
      ->type_name("SIZE")
      ->transform(quiet(CLI::AsSizeValue(false)))
      ->check(integer_at_least(1))
      ->default_str(size_text(*bytes));
}

CLI::Validator local_path(std::string what, std::string fix) {
  return CLI::Validator(
      [what, fix](std::string& text) -> std::string {
        const Status refused = require_local_path(text, what, fix);
        // CLI11 puts "<what>: " (the option's name) before a validator's message itself.
        return refused.is_ok() ? "" : refused.message().substr(what.size() + 2);
      },
      "");
}

CLI::Option* add_dataset_argument(CLI::App* command, const std::string& name, std::string* path) {
  command->add_flag("--no-cache", no_cache_flag(),
                    "Read a remote dataset without the node-local cache (docs/cache.md)");
  return command
      ->add_option(name, *path, "manifest.json, dataset directory, or one .zws/.tar shard")
      ->type_name("PATH")
      ->required();
}

CLI::Option* add_json_flag(CLI::App* command, bool* json) {
  return command->add_flag("--json", *json, "Print the result as JSON on stdout");
}

namespace {

constexpr const char* kFooter =
    "Exit codes:\n"
    "  0  success\n"
    "  1  error (the message names the file, offset and cause)\n"
    "  2  usage error (bad command line)\n"
    "  3  completed, but found problems (pack quarantined inputs, verify found bad samples,\n"
    "     ckpt verify found a damaged checkpoint step)\n"
    "\n"
    "Run 'zerowait COMMAND --help' for a command's arguments and an example.";

std::string usage_failure_message(const CLI::App* /*app*/, const CLI::Error& e) {
  return std::string("zerowait: error: ") + e.what() + "\nRun with --help for more information.\n";
}

int run(int argc, char** argv) {
  CLI::App app{
      "zerowait: pack small files into indexed shards, and inspect, verify and read them back;\n"
      "list, verify, inspect and clean up training checkpoints (zerowait ckpt); show and warm\n"
      "a dataset's page cache (zerowait cache); find the settings that make training wait\n"
      "(zerowait doctor) and measure storage, small files and the network (zerowait bench).",
      "zerowait"};
  app.set_version_flag("--version", "zerowait " ZEROWAIT_VERSION);
  app.require_subcommand(1);
  app.failure_message(usage_failure_message);
  app.footer(kFooter);

  std::vector<Command> commands = {add_pack_command(app),     add_merge_command(app),
                                   add_inspect_command(app),  add_verify_command(app),
                                   add_cat_command(app),      add_unpack_command(app),
                                   add_generate_command(app), add_ckpt_command(app),
                                   add_cache_command(app),    add_doctor_command(app),
                                   add_bench_command(app),    add_emulate_command(app),
                                   add_report_command(app),   add_watch_command(app),
                                   add_plan_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here too, with exit code 0.
    if (e.get_exit_code() != 0) {
      if (std::optional<std::string> unknown = unknown_command_message(app, argc, argv)) {
        std::cerr << "zerowait: error: " << *unknown << '\n';
        return kExitUsage;
      }
    }
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  for (const Command& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return kExitUsage;  // unreachable: require_subcommand(1) guarantees one was parsed
}

}  // namespace
}  // namespace zerowait::cli

int main(int argc, char** argv) {
  // A closed pipe (`zerowait cat ... | head`) becomes EPIPE from write(), handled where it
  // happens, instead of a silent death by signal.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return zerowait::cli::run(argc, argv);
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "zerowait: error: " << e.what() << '\n';
  } catch (...) {
    std::cout.flush();
    std::cerr << "zerowait: error: unknown exception\n";
  }
  return zerowait::cli::kExitError;
}
