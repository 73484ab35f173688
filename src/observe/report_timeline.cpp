// The timeline: where each step's time went, and what the machine was doing at that moment.
// steps.jsonl and system.jsonl share CLOCK_MONOTONIC seconds (docs/observe.md), so every chart
// here maps t through the same scale and their x coordinates line up down the page.
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <map>
#include <set>

#include "observe/report_sections.hpp"
#include "observe/report_text.hpp"
#include "observe/svg_chart.hpp"

namespace zerowait::observe {
namespace {

// System lines are averaged into at most this many points: a pixel column each, at most.
constexpr size_t kMaxLinePoints = 600;

Frame time_frame(double height) {
  Frame frame;
  frame.height = height;
  return frame;
}

// The time span every chart of the section draws, and the t shown as 0.
struct TimeAxis {
  double lo = 0;
  double hi = 1;
  LinearScale x(const Frame& frame) const {
    return LinearScale{lo, hi, frame.plot_left(), frame.plot_right()};
  }
};

struct StepGroup {
  int64_t first_step = 0;
  int64_t last_step = 0;
  size_t steps = 0;
  double start = 0;
  double end = 0;
  double wall = 0;
  std::vector<double> buckets;
};

// Consecutive steps of one rank merged `per_group` at a time.
std::vector<StepGroup> group_steps(const std::vector<const StepRecord*>& steps, size_t causes,
                                   size_t per_group) {
  std::vector<StepGroup> groups;
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& step = *steps[i];
    if (i % per_group == 0) {
      groups.push_back(StepGroup{step.step, step.step, 0, step.t, step.t, 0,
                                 std::vector<double>(causes, 0.0)});
    }
    StepGroup& group = groups.back();
    group.last_step = step.step + step.steps - 1;
    group.steps += static_cast<size_t>(step.steps);
    group.end = std::max(group.end, step.t + step.wall);
    group.wall += step.wall;
    for (size_t c = 0; c < causes && c < step.buckets.size(); ++c) {
      group.buckets[c] += step.buckets[c];
    }
  }
  return groups;
}

std::string group_tooltip(const StepGroup& group, const std::vector<std::string>& causes,
                          double origin) {
  std::string text = group.steps == 1 ? "step " + std::to_string(group.first_step)
                                      : "steps " + std::to_string(group.first_step) + "–" +
                                            std::to_string(group.last_step);
  text += " at " + time_label(group.start - origin) + ": " +
          format_seconds(group.wall / static_cast<double>(group.steps)) + " per step";
  for (size_t c = 0; c < causes.size(); ++c) {
    if (group.buckets[c] <= 0 || group.wall <= 0) continue;
    text += "; " + causes[c] + " " + format_percent(group.buckets[c] / group.wall);
  }
  return text;
}

void draw_event_lines(SvgCanvas& svg, const LinearScale& x, const std::vector<RunEvent>& events,
                      const std::string& css_class, bool numbered) {
  const Frame& f = svg.frame();
  for (size_t i = 0; i < events.size(); ++i) {
    const double at = x(events[i].t);
    svg.line(at, f.plot_top(), at, f.plot_bottom(), "#30343b", css_class, /*dashed=*/true);
    if (numbered) svg.text(at + 3, f.plot_top() + 10, std::to_string(i + 1), "event-number");
  }
}

std::string step_chart(const RunRecord& run, const std::vector<const StepRecord*>& steps,
                       const TimeAxis& axis, std::string& caption) {
  const std::vector<std::string>& causes = run.info.causes;
  const size_t per_group = (steps.size() + kMaxTimelineBars - 1) / kMaxTimelineBars;
  const std::vector<StepGroup> groups = group_steps(steps, causes.size(), per_group);
  SvgCanvas svg(time_frame(200), "Share of each step's wall time by cause, over time", "steps");
  const Frame& f = svg.frame();
  const LinearScale x = axis.x(f);
  const LinearScale y{0, 1, f.plot_bottom(), f.plot_top()};
  draw_y_axis(svg, y, {0, 0.5, 1}, format_percent_tick);
  for (const StepGroup& group : groups) {
    if (!(group.wall > 0)) continue;
    const double left = x(group.start);
    // A hair wider than the step: neighbours overlap instead of leaving hairline gaps.
    const double width = std::max(x(group.end) - left, 0.6) + 0.4;
    svg.open_group("bar", group_tooltip(group, causes, axis.lo));
    double top = f.plot_top();
    for (size_t c = 0; c < causes.size(); ++c) {
      const double height = group.buckets[c] / group.wall * (f.plot_bottom() - f.plot_top());
      if (height <= 0) continue;
      svg.rect(left, top, width, height, cause_colour(causes[c], c), "seg");
      top += height;
    }
    svg.close_group();
  }
  draw_event_lines(svg, x, run.info.events, "event", /*numbered=*/true);
  draw_time_axis(svg, x, axis.lo, /*labels=*/true);
  size_t total = 0;
  for (const StepGroup& group : groups) total += group.steps;
  // Rows of one step each are merged per_group to a bar; a profiler's merged rows vary.
  const std::string merged = total == steps.size() ? std::to_string(per_group) + " " : "";
  caption = total == groups.size()
                ? "Each bar is one step, as wide as the step took"
                : "Each bar merges " + merged + "neighbouring steps (" +
                      format_number(static_cast<double>(total)) + " steps drawn as " +
                      format_number(static_cast<double>(groups.size())) + " bars)";
  caption += "; its height splits the wall time by cause.";
  return svg.finish();
}

struct Series {
  std::string name;
  std::string colour;
  std::function<std::optional<double>(const SystemRecord&)> value;
};

// (t, mean value) per column of the time axis, for the samples that have a value.
std::vector<std::pair<double, double>> averaged(const std::vector<SystemRecord>& samples,
                                                const Series& series, const TimeAxis& axis) {
  std::vector<std::pair<double, double>> points;
  double sum_t = 0;
  double sum_v = 0;
  size_t count = 0;
  long column = -1;
  const double width = (axis.hi - axis.lo) / static_cast<double>(kMaxLinePoints);
  auto flush = [&] {
    if (count != 0) points.emplace_back(sum_t / count, sum_v / count);
    sum_t = sum_v = 0;
    count = 0;
  };
  for (const SystemRecord& sample : samples) {
    const std::optional<double> value = series.value(sample);
    if (!value) continue;
    const long at = static_cast<long>((sample.t - axis.lo) / width);
    if (at != column) flush();
    column = at;
    sum_t += sample.t;
    sum_v += *value;
    ++count;
  }
  flush();
  return points;
}

// A small line chart of system samples under the step chart. `y_max` 0: from the data.
std::string line_chart(const RunRecord& run, const TimeAxis& axis, const std::string& heading,
                       const std::vector<Series>& series, double y_max,
                       const std::function<std::string(double)>& label) {
  std::vector<std::vector<std::pair<double, double>>> lines;
  double highest = 0;
  bool any = false;
  for (const Series& s : series) {
    lines.push_back(averaged(run.system, s, axis));
    for (const auto& point : lines.back()) highest = std::max(highest, point.second);
    any = any || !lines.back().empty();
  }
  if (!any) return "";
  SvgCanvas svg(time_frame(110), heading, "system");
  const Frame& f = svg.frame();
  const LinearScale x = axis.x(f);
  const double top = y_max > 0 ? y_max : nice_ceiling(highest);
  const LinearScale y{0, top, f.plot_bottom(), f.plot_top()};
  draw_y_axis(svg, y, {0, top / 2, top}, label);
  for (size_t i = 0; i < series.size(); ++i) {
    std::vector<std::pair<double, double>> points;
    for (const auto& point : lines[i]) points.emplace_back(x(point.first), y(point.second));
    // A single sample still shows, as a dot-sized segment.
    if (points.size() == 1) points.emplace_back(points[0].first + 1, points[0].second);
    svg.polyline(points, series[i].colour, "series");
  }
  draw_event_lines(svg, x, run.info.events, "event-guide", /*numbered=*/false);
  draw_time_axis(svg, x, axis.lo, /*labels=*/true);
  std::string legend;
  if (series.size() > 1) {
    for (size_t i = 0; i < series.size(); ++i) {
      if (lines[i].empty()) continue;
      legend += " <span class=\"key\"><span class=\"swatch line\" style=\"background:" +
                series[i].colour + "\"></span>" + html_escape(series[i].name) + "</span>";
    }
  }
  return "<figure class=\"chart\"><figcaption>" + html_escape(heading) + legend +
         "</figcaption>" + svg.finish() + "</figure>";
}

// What the main thread was doing (watch): one strip, coloured like the causes.
std::string main_thread_chart(const RunRecord& run, const TimeAxis& axis) {
  struct Span {
    std::string state;
    double start;
    double end;
  };
  std::vector<Span> spans;
  const double min_width = (axis.hi - axis.lo) / static_cast<double>(kMaxLinePoints);
  for (size_t i = 0; i < run.system.size(); ++i) {
    const SystemRecord& sample = run.system[i];
    if (sample.main.empty()) continue;
    const double end = i + 1 < run.system.size() ? run.system[i + 1].t : sample.t + min_width;
    if (!spans.empty() && spans.back().state == sample.main &&
        (spans.back().end >= sample.t - 1e-9 || sample.t - spans.back().start < min_width)) {
      spans.back().end = end;
    } else {
      spans.push_back(Span{sample.main, sample.t, end});
    }
  }
  if (spans.empty()) return "";
  SvgCanvas svg(time_frame(56), "What the main thread was doing", "system");
  const Frame& f = svg.frame();
  const LinearScale x = axis.x(f);
  std::set<std::string> seen;
  for (const Span& span : spans) {
    const auto found = std::find(run.info.causes.begin(), run.info.causes.end(), span.state);
    const size_t index = static_cast<size_t>(found - run.info.causes.begin());
    svg.rect(x(span.start), f.plot_top(), std::max(x(span.end) - x(span.start), 0.6),
             f.plot_bottom() - f.plot_top(), cause_colour(span.state, index), "main-state",
             span.state + " from " + time_label(span.start - axis.lo));
    seen.insert(span.state);
  }
  draw_event_lines(svg, x, run.info.events, "event-guide", /*numbered=*/false);
  draw_time_axis(svg, x, axis.lo, /*labels=*/true);
  std::string legend;
  for (size_t c = 0; c < run.info.causes.size(); ++c) {
    if (seen.count(run.info.causes[c]) == 0) continue;
    legend += " <span class=\"key\"><span class=\"swatch\" style=\"background:" +
              cause_colour(run.info.causes[c], c) + "\"></span>" +
              html_escape(cause_label(run.info.causes[c])) + "</span>";
  }
  return "<figure class=\"chart\"><figcaption>Main thread" + legend + "</figcaption>" +
         svg.finish() + "</figure>";
}

// The device that was busiest on average, or "" without disk samples.
std::string busiest_disk(const std::vector<SystemRecord>& samples, size_t& devices) {
  std::map<std::string, std::pair<double, size_t>> busy;
  for (const SystemRecord& sample : samples) {
    for (const DiskRecord& disk : sample.disks) {
      auto& entry = busy[disk.name];
      entry.first += disk.busy.value_or(0);
      entry.second += 1;
    }
  }
  devices = busy.size();
  std::string best;
  double best_mean = -1;
  for (const auto& entry : busy) {
    const double mean = entry.second.first / static_cast<double>(entry.second.second);
    if (mean > best_mean) {
      best_mean = mean;
      best = entry.first;
    }
  }
  return best;
}

std::optional<double> disk_value(const SystemRecord& sample, const std::string& name,
                                 bool queue) {
  for (const DiskRecord& disk : sample.disks) {
    if (disk.name == name) return queue ? disk.queue : disk.busy;
  }
  return std::nullopt;
}

std::string system_charts(const RunRecord& run, const TimeAxis& axis) {
  const auto percent = format_percent_tick;
  const auto plain = format_tick;
  // What the main thread did reads like the step bars, so it comes first.
  std::string out = main_thread_chart(run, axis);
  size_t devices = 0;
  const std::string disk = busiest_disk(run.system, devices);
  if (!disk.empty()) {
    const std::string which =
        "Disk " + disk + (devices > 1 ? " (busiest of " + std::to_string(devices) + ")" : "");
    out += line_chart(run, axis, which + ": busy", {{"busy", "#d1495b", [disk](const auto& s) {
                                                       return disk_value(s, disk, false);
                                                     }}},
                      1.0, percent);
    out += line_chart(run, axis, which + ": queue (requests in flight)",
                      {{"queue", "#8f2d56",
                        [disk](const auto& s) { return disk_value(s, disk, true); }}},
                      0, plain);
  }
  const auto mb = [](std::optional<double> bps) -> std::optional<double> {
    if (!bps) return std::nullopt;
    return *bps / 1e6;
  };
  out += line_chart(run, axis, "Process I/O, MB/s",
                    {{"read", "#3c91e6", [mb](const auto& s) { return mb(s.read_bps); }},
                     {"write", "#f0a202", [mb](const auto& s) { return mb(s.write_bps); }}},
                    0, plain);
  const auto gb = [](std::optional<double> bytes) -> std::optional<double> {
    if (!bytes) return std::nullopt;
    return *bytes / 1e9;
  };
  out += line_chart(
      run, axis, "Memory, GB",
      {{"process RSS", "#a06cd5", [gb](const auto& s) { return gb(s.rss); }},
       {"available", "#59a96a", [gb](const auto& s) { return gb(s.mem_available); }}},
      0, plain);
  out += line_chart(run, axis, "CPU: machine busy",
                    {{"cpu", "#2e4057", [](const auto& s) { return s.cpu; }}}, 1.0, percent);
  out += line_chart(run, axis, "CPU: used by the process tree (1 = one CPU)",
                    {{"process", "#00798c", [](const auto& s) { return s.proc_cpu; }}}, 0,
                    plain);
  out += line_chart(run, axis, "GPU: SM utilisation",
                    {{"gpu", "#59a96a", [](const auto& s) { return s.gpu_util; }}}, 1.0,
                    percent);
  return out;
}

std::string events_list(const RunRecord& run, double origin) {
  if (run.info.events.empty()) return "";
  std::string out = "<ol class=\"events\">";
  for (const RunEvent& event : run.info.events) {
    out += "<li><span class=\"when\">" + html_escape(format_seconds(event.t - origin)) +
           "</span> " + html_escape(event.what);
    if (!event.before.empty()) {
      out += "<span class=\"before\">Just before: " + html_escape(event.before) + "</span>";
    }
    out += "</li>";
  }
  return out + "</ol>";
}

}  // namespace

std::string timeline_section(const RunRecord& run) {
  if (run.steps.empty() && run.system.empty()) return "";
  // Ranks run in lockstep, so one rank tells the story; the lowest is drawn.
  std::set<int64_t> ranks;
  for (const StepRecord& step : run.steps) ranks.insert(step.rank);
  std::vector<const StepRecord*> steps;
  for (const StepRecord& step : run.steps) {
    if (step.rank == *ranks.begin()) steps.push_back(&step);
  }
  std::stable_sort(steps.begin(), steps.end(),
                   [](const StepRecord* a, const StepRecord* b) { return a->t < b->t; });

  TimeAxis axis{INFINITY, -INFINITY};
  const auto extend = [&axis](double lo, double hi) {
    axis.lo = std::min(axis.lo, lo);
    axis.hi = std::max(axis.hi, hi);
  };
  for (const StepRecord* step : steps) extend(step->t, step->t + step->wall);
  for (const SystemRecord& sample : run.system) extend(sample.t, sample.t);
  for (const RunEvent& event : run.info.events) extend(event.t, event.t);
  if (!(axis.hi > axis.lo)) axis.hi = axis.lo + 1;

  std::string out =
      "<section id=\"timeline\"><h2>Timeline</h2><p class=\"lede\">Seconds since the first "
      "step or sample; every chart below shares this time axis.</p>";
  if (!steps.empty()) {
    std::string caption;
    const std::string chart = step_chart(run, steps, axis, caption);
    if (ranks.size() > 1) {
      caption += " Rank " + std::to_string(*ranks.begin()) + " of " +
                 std::to_string(ranks.size()) + " ranks is shown.";
    }
    out += "<figure class=\"chart\"><figcaption>Steps</figcaption>" + chart + "</figure>";
    out += "<p class=\"note\">" + html_escape(caption) + "</p>";
  } else {
    out += "<p class=\"note\">No steps.jsonl: the job's steps were not recorded.</p>";
  }
  out += events_list(run, axis.lo);
  if (!run.system.empty()) out += system_charts(run, axis);
  return out + "</section>";
}

}  // namespace zerowait::observe
