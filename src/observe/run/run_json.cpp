#include "observe/run/run_json.hpp"

#include <cmath>

#include "zerowait/observe/attribution.hpp"
#include "zerowait/observe/causes.hpp"

namespace zerowait::observe {
namespace {

nlohmann::ordered_json money_by_cause(const std::map<std::string, double>& money) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [cause, value] : money) out[cause] = rounded(value, 2);
  return out;
}

}  // namespace

double rounded(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

Result<nlohmann::ordered_json> cause_summary(const std::map<std::string, double>& seconds,
                                             double wall_s, int decimals) {
  for (const auto& [cause, value] : seconds) {
    if (!is_cause(cause)) {
      return invalid_argument("'" + cause + "' is not a cause of run.json (input, checkpoint, " +
                              "h2d, communication, compute, other)");
    }
  }
  const auto written = [decimals](double value) {
    return decimals < 0 ? value : rounded(value, decimals);
  };
  nlohmann::ordered_json causes = nlohmann::ordered_json::array();
  nlohmann::ordered_json seconds_json = nlohmann::ordered_json::object();
  nlohmann::ordered_json shares_json = nlohmann::ordered_json::object();
  std::map<std::string, double> shares;
  for (const char* cause : kCauses) {
    const auto it = seconds.find(cause);
    if (it == seconds.end()) continue;
    const double share = wall_s > 0 ? it->second / wall_s : 0.0;
    shares[cause] = share;
    causes.push_back(cause);
    seconds_json[cause] = written(it->second);
    shares_json[cause] = written(share);
  }
  return nlohmann::ordered_json{{"causes", causes},
                                {"seconds", seconds_json},
                                {"shares", shares_json},
                                {"verdict", wall_s > 0 ? verdict_of(shares) : "unknown"}};
}

nlohmann::ordered_json sample_json(const SystemSample& s) {
  nlohmann::ordered_json disk = nlohmann::ordered_json::object();
  for (const auto& [name, d] : s.disk) {
    disk[name] = {{"busy", rounded(d.busy, 4)},
                  {"queue", rounded(d.queue, 3)},
                  {"await_ms", d.await_ms ? nlohmann::ordered_json(rounded(*d.await_ms, 3))
                                          : nlohmann::ordered_json(nullptr)},
                  {"read_bps", std::round(d.read_bps)},
                  {"write_bps", std::round(d.write_bps)}};
  }
  nlohmann::ordered_json out = {
      {"t", rounded(s.t, 6)},
      {"cpu", rounded(s.cpu, 4)},
      {"proc_cpu", rounded(s.proc_cpu, 4)},
      {"rss", s.rss},
      {"mem_available", s.mem_available},
      {"swap_in", rounded(s.swap_in, 1)},
      {"swap_out", rounded(s.swap_out, 1)},
      {"read_bps", std::round(s.read_bps)},
      {"write_bps", std::round(s.write_bps)},
      {"disk", disk},
      {"threads",
       {{"running", s.threads.running}, {"io", s.threads.io}, {"sleeping", s.threads.sleeping}}},
      {"gpu_util", s.gpu_util ? nlohmann::ordered_json(rounded(*s.gpu_util, 4))
                              : nlohmann::ordered_json(nullptr)},
      {"gpu_mem", s.gpu_mem ? nlohmann::ordered_json(*s.gpu_mem) : nlohmann::ordered_json(nullptr)}};
  if (s.main) out["main"] = *s.main;
  return out;
}

nlohmann::ordered_json cost_json(const WaitCost& cost) {
  return {{"gpus", cost.gpus},
          {"gpu_hourly_cost", cost.gpu_hourly_cost},
          {"per_day", money_by_cause(cost.per_day)},
          {"per_year", money_by_cause(cost.per_year)},
          {"wait_per_day", rounded(cost.wait_per_day, 2)},
          {"wait_per_year", rounded(cost.wait_per_year, 2)}};
}

nlohmann::ordered_json comparison_json(const Comparison& c) {
  const auto money = [](const std::optional<double>& v) {
    return v ? nlohmann::ordered_json(rounded(*v, 2)) : nlohmann::ordered_json(nullptr);
  };
  return {{"before", c.before},
          {"basis", c.basis},
          {"saving_share", rounded(c.saving_share, 4)},
          {"saving_per_day", money(c.saving_per_day)},
          {"saving_per_year", money(c.saving_per_year)}};
}

Result<RunFigures> run_figures(const nlohmann::json& run, const std::string& where) {
  if (!run.is_object()) return invalid_argument(where + ": a run.json must be a JSON object");
  RunFigures figures;
  if (const auto t = run.find("throughput"); t != run.end() && !t->is_null()) {
    if (!t->is_object()) return invalid_argument(where + ": throughput must be an object");
    if (const auto sps = t->find("samples_per_s"); sps != t->end() && !sps->is_null()) {
      if (!sps->is_number()) {
        return invalid_argument(where + ": throughput.samples_per_s must be a number, found " +
                                sps->dump());
      }
      figures.samples_per_s = sps->get<double>();
    }
  }
  if (const auto shares = run.find("shares"); shares != run.end() && !shares->is_null()) {
    if (!shares->is_object()) return invalid_argument(where + ": shares must be an object");
    if (const auto c = shares->find("compute"); c != shares->end() && !c->is_null()) {
      if (!c->is_number() || c->get<double>() < 0 || c->get<double>() > 1) {
        return invalid_argument(where + ": shares.compute must be a number within [0, 1], found " +
                                c->dump());
      }
      figures.compute_share = c->get<double>();
    }
  }
  return figures;
}

}  // namespace zerowait::observe
