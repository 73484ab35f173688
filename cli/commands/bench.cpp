// `zerowait bench storage|files|net`: measurements of what feeds training, each beside the
// standard tool's or the plain way's number from the same run. Each subcommand lives in its own
// file (bench_storage.cpp, bench_files.cpp, bench_net.cpp); this one only joins them.
#include <vector>

#include "commands.hpp"
#include "output.hpp"

namespace zerowait::cli {

Command add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure storage, small files against shards, and the network, side by side");
  bench->require_subcommand(1);
  std::vector<Command> subcommands = {add_bench_storage_command(*bench),
                                      add_bench_files_command(*bench),
                                      add_bench_net_command(*bench)};
  return {bench, [subcommands]() -> int {
            for (const Command& command : subcommands) {
              if (command.app->parsed()) return command.run();
            }
            return kExitUsage;  // unreachable: require_subcommand(1)
          }};
}

}  // namespace zerowait::cli
