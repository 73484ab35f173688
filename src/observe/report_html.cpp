// The report page: header and verdict, where the time went, AU, money and the doctor's findings
// (the timeline has its own file). Every text from the run is escaped here or in svg_chart:
// titles and commands come from users.
#include <algorithm>
#include <cmath>

#include "observe/report_run.hpp"
#include "observe/report_sections.hpp"
#include "observe/report_text.hpp"
#include "observe/svg_chart.hpp"
#include "zerowait/observe/report.hpp"

namespace zerowait::observe {
namespace {

constexpr char kStyle[] = R"css(
:root{--ink:#1f2328;--muted:#5f6670;--line:#e3e6ea;--card:#fff;--page:#f5f6f8}
*{box-sizing:border-box}
body{margin:0;background:var(--page);color:var(--ink);
 font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1100px;margin:0 auto;padding:28px 24px 48px}
header,section{background:var(--card);border:1px solid var(--line);border-radius:10px;
 padding:20px 24px;margin-bottom:18px}
h1{font-size:26px;margin:2px 0 12px;line-height:1.25;overflow-wrap:anywhere}
h2{font-size:18px;margin:0 0 10px}
.eyebrow{margin:0;color:var(--muted);font-size:13px;text-transform:uppercase;letter-spacing:.06em}
.verdict{display:flex;align-items:baseline;gap:16px;flex-wrap:wrap;margin:6px 0 14px;
 padding:12px 16px;border-radius:8px;background:#f7f7f9;border-left:8px solid var(--tone)}
.verdict strong{font-size:40px;line-height:1.1;color:var(--tone)}
.verdict span{color:var(--muted);font-size:16px}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:4px 18px;margin:0}
dl.facts dt{color:var(--muted)}
dl.facts dd{margin:0;overflow-wrap:anywhere}
code{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f1f3f5;
 padding:1px 5px;border-radius:4px}
svg{display:block;width:100%;height:auto;font-family:inherit}
svg .tick{font-size:12px;fill:var(--muted)}
svg .label{font-size:13px;fill:var(--ink)}
svg .inside{font-size:12px;fill:#fff;font-weight:600}
svg .inside.dark{fill:#7a3420}
svg .event-number{font-size:11px;fill:#30343b;font-weight:700}
svg .series{stroke-width:1.6;stroke-linejoin:round}
svg.steps rect{shape-rendering:crispEdges}
figure.chart{margin:10px 0 4px}
figcaption{font-size:13px;font-weight:600;color:var(--ink);margin-bottom:2px}
.key{font-weight:400;color:var(--muted);margin-left:12px;white-space:nowrap}
.swatch{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;
 vertical-align:-1px}
.swatch.line{height:3px;vertical-align:3px}
table{border-collapse:collapse;width:100%;font-size:14px;margin-top:8px}
th,td{text-align:left;padding:5px 10px;border-bottom:1px solid var(--line)}
th{color:var(--muted);font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:700;border-top:2px solid var(--line)}
.lede{margin:0 0 8px;color:var(--muted)}
.note{font-size:13px;color:var(--muted);margin:4px 0}
.pass{color:#2e7d4f;font-weight:700}.fail{color:#c0392b;font-weight:700}
.callout{margin-top:12px;padding:10px 14px;border-radius:8px;background:#eef6f0;
 border:1px solid #cfe6d6}
ol.events{margin:8px 0 12px;padding-left:22px;font-size:14px}
ol.events .when{font-weight:700;font-variant-numeric:tabular-nums;margin-right:6px}
ol.events .before{display:block;color:var(--muted);font-size:13px}
ul.findings{list-style:none;margin:0;padding:0}
ul.findings li{padding:8px 0;border-bottom:1px solid var(--line)}
.badge{display:inline-block;min-width:46px;text-align:center;font-size:11px;font-weight:700;
 border-radius:4px;padding:1px 6px;margin-right:8px;color:#fff;vertical-align:1px}
.badge.fail{background:#c0392b}.badge.warn{background:#d68910}
.finding-meta{display:block;color:var(--muted);font-size:13px;margin-left:62px}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:8px}
)css";

std::string capitalised(std::string text) {
  if (!text.empty() && text[0] >= 'a' && text[0] <= 'z') text[0] = static_cast<char>(text[0] - 32);
  return text;
}

std::string verdict_text(const RunInfo& info) {
  return info.verdict.empty() ? "unknown" : info.verdict;
}

// The colour of the cause a verdict names ("input-bound" -> input's).
std::string verdict_colour(const RunInfo& info) {
  const std::string verdict = verdict_text(info);
  const size_t dash = verdict.find("-bound");
  if (dash == std::string::npos) return "#5f6670";
  const std::string cause = verdict.substr(0, dash);
  const auto found = std::find(info.causes.begin(), info.causes.end(), cause);
  return cause_colour(cause, static_cast<size_t>(found - info.causes.begin()));
}

double share_of(const RunInfo& info, const std::string& cause) {
  const auto found = info.shares.find(cause);
  return found == info.shares.end() ? 0 : found->second;
}

// The causes by share, largest first.
std::vector<std::string> ranked_causes(const RunInfo& info) {
  std::vector<std::string> causes = info.causes;
  std::stable_sort(causes.begin(), causes.end(), [&info](const auto& a, const auto& b) {
    return share_of(info, a) > share_of(info, b);
  });
  return causes;
}

// "input 19.8 %, compute 65.4 %": the largest wait, then compute.
std::string shares_phrase(const RunInfo& info) {
  std::string phrase;
  for (const std::string& cause : ranked_causes(info)) {
    if (cause == "compute" || share_of(info, cause) <= 0) continue;
    phrase = "the largest wait is " + cause + " at " + format_percent(share_of(info, cause));
    break;
  }
  if (info.shares.count("compute") != 0) {
    if (!phrase.empty()) phrase += "; ";
    phrase += "compute " + format_percent(share_of(info, "compute"));
  }
  return phrase.empty() ? "no time recorded" : phrase + " of the wall time";
}

std::string shell_words(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& word : words) {
    if (!out.empty()) out += ' ';
    const bool plain = !word.empty() && word.find_first_not_of(
                                            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789-_./=:,+@%") == std::string::npos;
    if (plain) {
      out += word;
    } else {
      std::string quoted = "'";
      for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      out += quoted + "'";
    }
  }
  return out;
}

std::string header_section(const RunRecord& run) {
  const RunInfo& info = run.info;
  std::string out = "<header id=\"summary\"><p class=\"eyebrow\">zerowait report · " +
                    html_escape(info.kind.empty() ? "run" : info.kind) + "</p>";
  out += "<h1>" + html_escape(info.title.empty() ? run.dir : info.title) + "</h1>";
  out += "<div class=\"verdict\" style=\"--tone:" + verdict_colour(info) + "\"><strong>" +
         html_escape(capitalised(verdict_text(info))) + "</strong><span>" +
         html_escape(capitalised(shares_phrase(info))) + "</span></div>";
  // The change most likely to help, with its number, right under the verdict it follows.
  for (const std::string& change : info.advice) {
    out += "<p class=\"change\"><strong>Change:</strong> " + html_escape(change) + "</p>";
  }
  std::vector<std::pair<std::string, std::string>> facts;  // label, HTML
  if (!info.command.empty()) {
    facts.emplace_back("Command", "<code>" + html_escape(shell_words(info.command)) + "</code>");
  }
  if (info.started_unix) {
    facts.emplace_back("Started", html_escape(format_utc(*info.started_unix)));
  }
  if (info.duration_s) {
    facts.emplace_back("Duration", html_escape(format_seconds(*info.duration_s)));
  }
  if (info.samples_per_s || info.mb_per_s) {
    std::string text;
    if (info.samples_per_s) text = format_number(*info.samples_per_s) + " samples/s";
    if (info.mb_per_s) {
      text += (text.empty() ? "" : ", ") + format_number(*info.mb_per_s, 1) + " MB/s";
    }
    facts.emplace_back("Throughput", html_escape(text));
  }
  if (info.au) {
    std::string text = format_percent(info.au->value);
    if (info.au->floor) text += " (floor " + format_percent(*info.au->floor) + ")";
    std::string html = html_escape(text);
    if (info.au->pass) {
      html += *info.au->pass ? " <span class=\"pass\">pass</span>"
                             : " <span class=\"fail\">fail</span>";
    }
    facts.emplace_back("AU", html);
  }
  if (!run.steps.empty()) {
    int64_t steps = 0;
    for (const StepRecord& step : run.steps) steps += step.steps;
    facts.emplace_back("Steps", html_escape(format_number(static_cast<double>(steps)) +
                                            " recorded"));
  }
  out += "<dl class=\"facts\">";
  for (const auto& fact : facts) out += "<dt>" + fact.first + "</dt><dd>" + fact.second + "</dd>";
  return out + "</dl></header>";
}

struct BarSegment {
  double share;
  std::string colour;
  std::string tooltip;
  std::string label_class = "inside";  // "inside dark" on a pale colour
};

// One labelled 100 % bar of segments, at row `y` of the canvas.
void draw_share_bar(SvgCanvas& svg, double y, double height, const std::string& label,
                    const std::vector<BarSegment>& segments) {
  const Frame& f = svg.frame();
  const LinearScale x{0, 1, f.plot_left(), f.plot_right()};
  svg.text(f.plot_left() - 10, y + height / 2 + 5, label, "label", "end");
  svg.open_group("bar");
  double at = 0;
  for (const BarSegment& segment : segments) {
    if (!(segment.share > 0)) continue;
    const double width = x(at + segment.share) - x(at);
    svg.rect(x(at), y, width, height, segment.colour, "seg", segment.tooltip);
    if (width > 54) {
      svg.text(x(at) + width / 2, y + height / 2 + 4, format_percent(segment.share),
               segment.label_class, "middle");
    }
    at += segment.share;
  }
  svg.close_group();
}

std::string row_label(const RunRow& row) {
  std::string label = row.input.empty() ? "configuration" : row.input;
  if (row.accelerators) {
    const long n = std::lround(*row.accelerators);
    label += " · " + std::to_string(n) + (n == 1 ? " accelerator" : " accelerators");
  }
  return label;
}

std::string where_time_went_section(const RunRecord& run) {
  const RunInfo& info = run.info;
  constexpr double kBar = 34;
  constexpr double kGap = 14;
  const size_t bars = 1 + info.rows.size();
  Frame frame;
  frame.left = 230;
  frame.right = 28;
  frame.top = 8;
  frame.bottom = 28;
  frame.height = frame.top + frame.bottom + static_cast<double>(bars) * (kBar + kGap) - kGap;
  SvgCanvas svg(frame, "Share of the wall time by cause", "shares");
  const LinearScale x{0, 1, frame.plot_left(), frame.plot_right()};
  for (double tick : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    svg.line(x(tick), frame.plot_top(), x(tick), frame.plot_bottom() + 4, "#e6e8eb", "grid");
    svg.text(x(tick), frame.plot_bottom() + 18, format_percent_tick(tick), "tick", "middle");
  }
  std::vector<BarSegment> whole;
  for (size_t c = 0; c < info.causes.size(); ++c) {
    const std::string& cause = info.causes[c];
    whole.push_back({share_of(info, cause), cause_colour(cause, c),
                     cause_label(cause) + ": " + format_percent(share_of(info, cause))});
  }
  draw_share_bar(svg, frame.top, kBar, "Whole run", whole);
  bool au_only_rows = false;
  for (size_t r = 0; r < info.rows.size(); ++r) {
    const RunRow& row = info.rows[r];
    std::vector<BarSegment> segments;
    if (!row.shares.empty()) {
      for (size_t c = 0; c < info.causes.size(); ++c) {
        const auto found = row.shares.find(info.causes[c]);
        const double share = found == row.shares.end() ? 0 : found->second;
        segments.push_back({share, cause_colour(info.causes[c], c),
                            cause_label(info.causes[c]) + ": " + format_percent(share)});
      }
    } else if (row.au) {
      // A row with AU only: compute is AU, the rest is time the accelerators were not busy.
      au_only_rows = true;
      const double au = std::clamp(*row.au, 0.0, 1.0);
      segments.push_back({au, cause_colour("compute", 0), "Compute (AU): " + format_percent(au)});
      segments.push_back({1 - au, "#f4c7b8",
                          "Not computing (1 − AU): " + format_percent(1 - au), "inside dark"});
    }
    draw_share_bar(svg, frame.top + static_cast<double>(r + 1) * (kBar + kGap), kBar,
                   row_label(row), segments);
  }

  std::string out =
      "<section id=\"where-time-went\"><h2>Where the time went</h2>"
      "<p class=\"lede\">Share of the wall time by cause; compute is what is left when every "
      "wait is taken out.</p>" +
      svg.finish();
  out += "<table><thead><tr><th>Cause</th><th class=\"num\">Seconds</th>"
         "<th class=\"num\">Share</th></tr></thead><tbody>";
  for (size_t c = 0; c < info.causes.size(); ++c) {
    const std::string& cause = info.causes[c];
    const auto seconds = info.seconds.find(cause);
    out += "<tr><td><span class=\"swatch\" style=\"background:" + cause_colour(cause, c) +
           "\"></span>" + html_escape(cause_label(cause)) + "</td><td class=\"num\">" +
           (seconds == info.seconds.end() ? "–" : html_escape(format_seconds(seconds->second))) +
           "</td><td class=\"num\">" + html_escape(format_percent(share_of(info, cause))) +
           "</td></tr>";
  }
  out += "</tbody></table>";
  if (au_only_rows) {
    out += "<p class=\"note\">The configurations give AU only: pale red is the time their "
           "accelerators were not computing.</p>";
  }
  return out + "</section>";
}

struct AuBar {
  std::string label;
  double au;
  std::optional<double> floor;
  std::optional<bool> pass;
};

std::string au_section(const RunInfo& info) {
  std::vector<AuBar> bars;
  for (const RunRow& row : info.rows) {
    if (row.au) bars.push_back({row_label(row), *row.au, row.floor, row.pass});
  }
  if (bars.empty() && info.au) {
    bars.push_back({"This run", info.au->value, info.au->floor, info.au->pass});
  }
  if (bars.empty()) return "";
  constexpr double kBar = 26;
  constexpr double kGap = 12;
  Frame frame;
  frame.left = 230;
  frame.right = 110;
  frame.top = 8;
  frame.bottom = 28;
  frame.height = frame.top + frame.bottom + static_cast<double>(bars.size()) * (kBar + kGap) - kGap;
  SvgCanvas svg(frame, "Accelerator utilisation per configuration against its floor", "au");
  double top_value = 1;
  for (const AuBar& bar : bars) top_value = std::max(top_value, bar.au);
  const LinearScale x{0, top_value, frame.plot_left(), frame.plot_right()};
  for (double tick : nice_ticks(0, top_value, 4)) {
    svg.line(x(tick), frame.plot_top(), x(tick), frame.plot_bottom() + 4, "#e6e8eb", "grid");
    svg.text(x(tick), frame.plot_bottom() + 18, format_percent_tick(tick), "tick", "middle");
  }
  for (size_t i = 0; i < bars.size(); ++i) {
    const AuBar& bar = bars[i];
    const double y = frame.top + static_cast<double>(i) * (kBar + kGap);
    const bool passed = bar.pass.value_or(!bar.floor || bar.au >= *bar.floor);
    const std::string verdict = !bar.floor && !bar.pass ? "" : passed ? "pass" : "fail";
    svg.text(frame.plot_left() - 10, y + kBar / 2 + 5, bar.label, "label", "end");
    svg.rect(x(0), y, std::max(x(std::max(bar.au, 0.0)) - x(0), 0.0), kBar,
             verdict == "fail" ? "#d1495b" : verdict == "pass" ? "#59a96a" : "#3c91e6",
             "au-bar " + (verdict.empty() ? std::string("unjudged") : verdict),
             bar.label + ": AU " + format_percent(bar.au));
    if (bar.floor) {
      svg.line(x(*bar.floor), y - 4, x(*bar.floor), y + kBar + 4, "#30343b", "floor");
    }
    std::string mark = format_percent(bar.au);
    if (!verdict.empty()) mark += verdict == "pass" ? "  ✓ pass" : "  ✗ fail";
    svg.text(frame.plot_right() + 8, y + kBar / 2 + 5, mark,
             "label " + (verdict.empty() ? std::string("plain") : verdict));
  }
  std::string out =
      "<section id=\"au\"><h2>Accelerator utilisation (AU)</h2><p class=\"lede\">The share of "
      "the time the accelerators computed; the black line on each bar is its floor.";
  if (info.au && !info.au->rule.empty()) out += " Rule: " + html_escape(info.au->rule) + ".";
  out += "</p>" + svg.finish();
  bool any_rate = false;
  for (const RunRow& row : info.rows) any_rate = any_rate || row.samples_per_s || row.mb_per_s;
  if (any_rate) {
    out += "<table><thead><tr><th>Configuration</th><th class=\"num\">AU</th>"
           "<th class=\"num\">Floor</th><th class=\"num\">Samples/s</th>"
           "<th class=\"num\">MB/s</th></tr></thead><tbody>";
    for (const RunRow& row : info.rows) {
      const auto cell = [](const std::optional<double>& v, int decimals) {
        return "<td class=\"num\">" + (v ? html_escape(format_number(*v, decimals)) : "–") +
               "</td>";
      };
      out += "<tr><td>" + html_escape(row_label(row)) + "</td><td class=\"num\">" +
             (row.au ? html_escape(format_percent(*row.au)) : "–") + "</td><td class=\"num\">" +
             (row.floor ? html_escape(format_percent(*row.floor)) : "–") + "</td>" +
             cell(row.samples_per_s, 0) + cell(row.mb_per_s, 1) + "</tr>";
    }
    out += "</tbody></table>";
  }
  return out + "</section>";
}

std::string money_cell(const std::map<std::string, double>& values, const std::string& cause) {
  const auto found = values.find(cause);
  return "<td class=\"num\">" +
         (found == values.end() ? std::string("–") : html_escape(format_money(found->second))) +
         "</td>";
}

std::string money_section(const RunInfo& info) {
  if (!info.cost) return "";
  const RunCost& cost = *info.cost;
  std::string out = "<section id=\"money\"><h2>What the waiting costs</h2><p class=\"lede\">";
  if (cost.gpus && cost.gpu_hourly_cost) {
    out += html_escape("At " + format_number(*cost.gpus) + " GPUs × " +
                       format_money(*cost.gpu_hourly_cost) + "/hour, around the clock: ");
  }
  out += "each cause's share of the GPU bill.</p>";
  out += "<table><thead><tr><th>Cause</th><th class=\"num\">Per day</th>"
         "<th class=\"num\">Per year</th></tr></thead><tbody>";
  for (size_t c = 0; c < info.causes.size(); ++c) {
    const std::string& cause = info.causes[c];
    if (cost.per_day.count(cause) == 0 && cost.per_year.count(cause) == 0) continue;
    out += "<tr><td><span class=\"swatch\" style=\"background:" + cause_colour(cause, c) +
           "\"></span>" + html_escape(cause_label(cause)) +
           (cause == "compute" ? " <span class=\"note\">(useful work)</span>" : "") + "</td>" +
           money_cell(cost.per_day, cause) + money_cell(cost.per_year, cause) + "</tr>";
  }
  if (cost.wait_per_day || cost.wait_per_year) {
    out += "<tr class=\"total\"><td>All waiting</td><td class=\"num\">" +
           (cost.wait_per_day ? html_escape(format_money(*cost.wait_per_day)) + "/day" : "–") +
           "</td><td class=\"num\">" +
           (cost.wait_per_year ? html_escape(format_money(*cost.wait_per_year)) + "/year" : "–") +
           "</td></tr>";
  }
  out += "</tbody></table>";
  if (info.comparison) {
    const RunComparison& cmp = *info.comparison;
    out += "<div class=\"callout comparison\">";
    if (cmp.saving_share) {
      out += "<strong>" + html_escape(format_percent(*cmp.saving_share)) +
             " less GPU time</strong> for the same work";
    } else {
      out += "<strong>Compared</strong>";
    }
    if (!cmp.before.empty()) out += " than <code>" + html_escape(cmp.before) + "</code>";
    if (cmp.saving_per_day || cmp.saving_per_year) {
      out += ": ";
      if (cmp.saving_per_day) out += html_escape(format_money(*cmp.saving_per_day)) + "/day";
      if (cmp.saving_per_day && cmp.saving_per_year) out += ", ";
      if (cmp.saving_per_year) out += html_escape(format_money(*cmp.saving_per_year)) + "/year";
      out += " saved";
    }
    out += ".</div>";
  }
  return out + "</section>";
}

std::string doctor_section(const RunInfo& info, const ReportOptions& options) {
  const bool live = options.doctor.has_value();
  if (!live && !info.doctor) return "";
  const std::vector<ReportFinding>& all = live ? *options.doctor : *info.doctor;
  std::vector<const ReportFinding*> problems;
  for (const char* severity : {"fail", "warn"}) {
    for (const ReportFinding& finding : all) {
      if (finding.severity == severity) problems.push_back(&finding);
    }
  }
  std::string out = "<section id=\"doctor\"><h2>What the doctor found</h2><p class=\"lede\">";
  out += live ? "Checked while this report was written (<code>zerowait doctor</code>)."
              : "Recorded with the run (<code>zerowait doctor</code>).";
  out += "</p>";
  if (problems.empty()) {
    return out + "<p>No check failed or warned (" + std::to_string(all.size()) +
           " checks).</p></section>";
  }
  out += "<ul class=\"findings\">";
  const size_t shown = std::min(problems.size(), kMaxReportFindings);
  for (size_t i = 0; i < shown; ++i) {
    const ReportFinding& f = *problems[i];
    out += "<li class=\"finding\"><span class=\"badge " + html_escape(f.severity) + "\">" +
           (f.severity == "fail" ? "FAIL" : "WARN") + "</span>" + html_escape(f.summary);
    std::string meta = "<code>" + html_escape(f.check) + "</code>";
    if (!f.subject.empty()) meta += " · " + html_escape(f.subject);
    if (!f.fix.empty()) meta += " · fix: <code>" + html_escape(f.fix) + "</code>";
    out += "<span class=\"finding-meta\">" + meta + "</span></li>";
  }
  out += "</ul>";
  if (problems.size() > shown) {
    out += "<p class=\"note\">" + std::to_string(problems.size() - shown) +
           " more; <code>zerowait doctor</code> lists them all with evidence and fixes.</p>";
  }
  return out + "</section>";
}

std::string page_summary(const RunInfo& info) {
  std::string summary = verdict_text(info) + ": " + shares_phrase(info);
  for (const std::string& change : info.advice) summary += "; change: " + change;
  if (info.au) {
    summary += "; AU " + format_percent(info.au->value);
    if (info.au->pass) summary += *info.au->pass ? " (pass)" : " (fail)";
  }
  return summary;
}

// The id of a <section ...> or <header ...> element, "" for "".
std::string section_id(const std::string& html) {
  const size_t at = html.find("id=\"");
  if (at == std::string::npos) return "";
  return html.substr(at + 4, html.find('"', at + 4) - at - 4);
}

}  // namespace

Result<ReportPage> render_report(const std::string& run_dir, const ReportOptions& options) {
  ZW_ASSIGN_OR_RETURN(const RunRecord run, read_run_directory(run_dir));
  const std::vector<std::string> parts = {
      header_section(run),    where_time_went_section(run), au_section(run.info),
      timeline_section(run),  money_section(run.info),      doctor_section(run.info, options)};
  ReportPage page;
  page.summary = page_summary(run.info);
  const std::string title = run.info.title.empty() ? run.dir : run.info.title;
  page.html = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
              "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
              "<title>" + html_escape(title) + " · zerowait report</title><style>" +
              kStyle + "</style></head><body><main>";
  for (const std::string& part : parts) {
    if (part.empty()) continue;
    page.sections.push_back(section_id(part));
    page.html += part + "\n";
  }
  for (const std::string& note : run.notes) {
    page.html += "<p class=\"note\">" + html_escape(note) + "</p>";
  }
  page.html += "<footer>Written by " + html_escape(options.generator) + " from " +
               html_escape(run.dir) + ".</footer></main></body></html>\n";
  return page;
}

}  // namespace zerowait::observe
