#include "zerowait/observe/attribution.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/text.hpp"
#include "zerowait/observe/activity.hpp"
#include "zerowait/observe/causes.hpp"

namespace zerowait::observe {
namespace {

using internal::format_fixed;

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

std::string rate_text(double bytes_per_s) {
  return format_fixed(bytes_per_s / (1024 * 1024), 1) + " MiB/s";
}

struct Window {
  double start = 0;
  double value = 0;
};

// What the system did in [from, to): the facts that explain a drop.
std::string explain(const std::vector<SystemSample>& samples, double from, double to,
                    double median_write_bps, const AttributionRules& rules) {
  double max_queue = 0;
  std::string queue_device;
  double max_swap_in = 0;
  int max_blocked = 0;
  double max_write = 0;
  for (const SystemSample& s : samples) {
    if (s.t < from || s.t >= to) continue;
    for (const auto& [name, d] : s.disk) {
      if (d.queue > max_queue) {
        max_queue = d.queue;
        queue_device = name;
      }
    }
    max_swap_in = std::max(max_swap_in, s.swap_in);
    max_blocked = std::max(max_blocked, s.threads.io);
    max_write = std::max(max_write, s.write_bps);
  }
  std::vector<std::string> facts;
  if (max_queue >= 1) {
    facts.push_back("disk queue " + format_fixed(max_queue, 1) + " on " + queue_device);
  }
  if (max_swap_in > 0) facts.push_back("swap-in " + format_fixed(max_swap_in, 0) + " pages/s");
  if (max_blocked > 0) {
    facts.push_back(std::to_string(max_blocked) +
                    (max_blocked == 1 ? " thread" : " threads") + " blocked on I/O");
  }
  if (max_write > rules.write_burst_factor * median_write_bps &&
      max_write >= rules.write_burst_min_bps) {
    facts.push_back("write burst " + rate_text(max_write));
  }
  if (facts.empty()) return "no disk queue, swap-in, blocked threads or write burst";
  std::string text = facts[0];
  for (size_t i = 1; i < facts.size(); ++i) text += "; " + facts[i];
  return text;
}

}  // namespace

const char* activity_name(Activity activity) {
  switch (activity) {
    case Activity::kInput:
      return "input";
    case Activity::kCheckpoint:
      return "checkpoint";
    case Activity::kCommunication:
      return "communication";
    case Activity::kCompute:
      return "compute";
    case Activity::kOther:
      return "other";
  }
  return "other";
}

std::optional<Activity> parse_activity(std::string_view name) {
  for (Activity a : kActivities) {
    if (name == activity_name(a)) return a;
  }
  return std::nullopt;
}

std::string verdict_of(const std::map<std::string, double>& shares,
                       const AttributionRules& rules) {
  const auto share_of = [&shares](const std::string& cause) {
    const auto it = shares.find(cause);
    return it == shares.end() ? 0.0 : it->second;
  };
  std::string largest;
  double largest_share = -1;
  for (const char* cause : kCauses) {
    if (names_verdict(cause) && share_of(cause) > largest_share) {
      largest = cause;
      largest_share = share_of(cause);
    }
  }
  if (largest_share >= rules.bound_share) return largest + "-bound";
  if (share_of("compute") >= rules.compute_bound_share) return "compute-bound";
  return "unknown";
}

std::vector<DropEvent> find_drops(const std::vector<SystemSample>& samples,
                                  const AttributionRules& rules) {
  std::vector<DropEvent> events;
  if (samples.empty() || !(rules.window_s > 0)) return events;
  const bool use_gpu = std::any_of(samples.begin(), samples.end(),
                                   [](const SystemSample& s) { return s.gpu_util.has_value(); });
  const std::string measure = use_gpu ? "GPU utilisation" : "compute share";
  const double t0 = samples.front().t;
  std::map<long, std::pair<double, size_t>> sums;  // window index -> (sum, count)
  for (const SystemSample& s : samples) {
    std::optional<double> value;
    if (use_gpu) {
      value = s.gpu_util;
    } else if (s.main) {
      value = *s.main == "compute" ? 1.0 : 0.0;
    }
    if (!value) continue;
    auto& [sum, count] = sums[std::lround(std::floor((s.t - t0) / rules.window_s))];
    sum += *value;
    ++count;
  }
  std::vector<Window> windows;
  for (const auto& [index, sum_count] : sums) {
    if (sum_count.second < rules.min_window_samples) continue;
    windows.push_back({t0 + double(index) * rules.window_s, sum_count.first / sum_count.second});
  }
  std::vector<double> values;
  std::vector<double> writes;
  for (const Window& w : windows) values.push_back(w.value);
  for (const SystemSample& s : samples) writes.push_back(s.write_bps);
  const double typical = median(values);
  if (typical < rules.drop_min_median) return events;
  const double median_write = median(writes);
  for (const Window& w : windows) {
    if (w.value >= rules.drop_fraction * typical) continue;
    DropEvent e;
    e.t = w.start;
    e.what = measure + " fell from " + format_fixed(typical, 2) + " to " + format_fixed(w.value, 2);
    e.before = explain(samples, w.start - rules.lookback_s, w.start + rules.window_s,
                       median_write, rules);
    e.depth = typical - w.value;
    events.push_back(std::move(e));
  }
  return events;
}

Attribution attribute(const std::vector<SystemSample>& samples, double duration_s,
                      const AttributionRules& rules) {
  Attribution a;
  // Each sample stands for the time until the next one (the last, for the gap before it).
  // Readings do not come evenly: watching a running main thread takes longer than reading a
  // blocked one, and a reading that overruns the interval skips ticks, so counting samples
  // would over-weight the states that are read quickly. Samples all at one time count one each.
  const auto weight = [&samples](size_t i) {
    const size_t next = i + 1 < samples.size() ? i + 1 : i;
    const size_t at = next == i && i > 0 ? i - 1 : i;
    return std::max(0.0, samples[next].t - samples[at].t);
  };
  double total = 0;
  for (size_t i = 0; i < samples.size(); ++i) total += samples[i].main ? weight(i) : 0;
  std::map<std::string, double> weights;
  for (Activity activity : kActivities) weights[activity_name(activity)] = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!samples[i].main) continue;
    weights[*samples[i].main] += total > 0 ? weight(i) : 1.0;
    ++a.classified;
  }
  if (!(total > 0)) total = double(a.classified);
  a.duration_s = duration_s > 0 || samples.empty() ? duration_s
                                                   : samples.back().t - samples.front().t;
  for (const auto& [cause, w] : weights) {
    const double share = a.classified == 0 ? 0 : w / total;
    a.shares[cause] = share;
    a.seconds[cause] = share * a.duration_s;
  }
  a.verdict = a.classified == 0 ? "unknown" : verdict_of(a.shares, rules);
  a.events = find_drops(samples, rules);
  return a;
}

}  // namespace zerowait::observe
