#include "zerowait/observe/watch_run.hpp"

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "common/file.hpp"
#include "observe/run/run_directory.hpp"
#include "observe/run/run_json.hpp"

namespace zerowait::observe {
namespace {

nlohmann::ordered_json watch_run_document(const WatchRun& run) {
  // Every activity is a cause, so the summary cannot refuse these.
  const nlohmann::ordered_json summary =
      cause_summary(run.attribution.seconds, run.attribution.duration_s, 4).value();
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  for (const DropEvent& e : run.attribution.events) {
    events.push_back({{"t", rounded(e.t, 3)}, {"what", e.what}, {"before", e.before}});
  }
  nlohmann::ordered_json advice = nlohmann::ordered_json::array();
  for (const WatchAdvice& a : run.advice) {
    advice.push_back({{"cause", "input"},
                      {"stage", "workers"},
                      {"change", a.change},
                      {"workers", a.workers},
                      {"workers_cpu", rounded(a.workers_cpu, 3)},
                      {"predicted_input_share", rounded(a.predicted_input_share, 4)},
                      {"summary", a.summary}});
  }
  return {{"schema", kRunSchema},
          {"kind", "watch"},
          {"title", run.title},
          {"command", run.command},
          {"started_unix", rounded(run.started_unix, 3)},
          {"duration_s", rounded(run.duration_s, 3)},
          {"startup_s", rounded(run.startup_s, 3)},
          {"shutdown_s", rounded(run.shutdown_s, 3)},
          {"exit_code", run.exit_code ? nlohmann::ordered_json(*run.exit_code)
                                      : nlohmann::ordered_json(nullptr)},
          {"failed", run.failed},
          {"degraded", run.degraded.empty() ? nlohmann::ordered_json(nullptr)
                                            : nlohmann::ordered_json(run.degraded)},
          {"causes", summary["causes"]},
          {"seconds", summary["seconds"]},
          {"shares", summary["shares"]},
          {"verdict", run.failed ? nlohmann::ordered_json("failed") : summary["verdict"]},
          {"cost", run.cost ? cost_json(*run.cost) : nlohmann::ordered_json(nullptr)},
          {"comparison",
           run.comparison ? comparison_json(*run.comparison) : nlohmann::ordered_json(nullptr)},
          {"events", events},
          {"advice", advice}};
}

}  // namespace

std::string watch_run_json(const WatchRun& run) { return watch_run_document(run).dump(2) + "\n"; }

Status write_watch_run(const std::string& dir, const WatchRun& run) {
  std::string lines;
  for (const SystemSample& s : run.samples) lines += to_json(s) + "\n";
  return write_run_directory(dir, watch_run_document(run), {{"system.jsonl", std::move(lines)}});
}

Result<RunFigures> read_run_figures(const std::string& dir) {
  const std::string path = dir + "/run.json";
  Result<std::string> text = internal::read_whole_file(path);
  if (!text.is_ok()) {
    if (text.status().code() == ErrorCode::kNotFound) {
      return not_found("no run.json in '" + dir +
                       "': name a directory that zerowait watch (or profile, emulate) wrote");
    }
    return text.status();
  }
  const nlohmann::json run = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (run.is_discarded()) return corrupt("'" + path + "' is not valid JSON");
  return run_figures(run, path);
}

}  // namespace zerowait::observe
