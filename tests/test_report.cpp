// `zerowait report`: run directories written here the way docs/observe.md says producers write
// them, drawn into a page whose sections, bars and markers are counted; broken inputs give
// errors that name the file, the line and the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/testing.hpp"
#include "zerowait/observe/report.hpp"

namespace zerowait {
namespace {

using Json = nlohmann::ordered_json;
using observe::render_report;
using observe::ReportPage;
using testing::read_file;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

const std::vector<std::string> kCauses = {"input",         "checkpoint", "h2d",
                                          "communication", "compute",    "other"};

// Occurrences of `needle` in `text`.
size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// The HTML of the section (or header) with this id, "" when the page has none.
std::string section(const std::string& html, const std::string& id) {
  const size_t start = html.find("id=\"" + id + "\"");
  if (start == std::string::npos) return "";
  const size_t end = html.find(id == "summary" ? "</header>" : "</section>", start);
  return html.substr(start, end - start);
}

Json base_run(const std::string& kind) {
  return Json{{"schema", "zerowait.run/1"},
              {"kind", kind},
              {"title", "resnet50 on /data, 4 accelerators (h100)"},
              {"command", {"zerowait", kind, "resnet50", "--data", "/data"}},
              {"started_unix", 1796284800.0},
              {"duration_s", 61.2},
              {"causes", kCauses},
              {"seconds",
               {{"input", 12.1},
                {"checkpoint", 1.2},
                {"h2d", 0.4},
                {"communication", 3.3},
                {"compute", 40.0},
                {"other", 4.2}}},
              {"shares",
               {{"input", 0.198},
                {"checkpoint", 0.020},
                {"h2d", 0.007},
                {"communication", 0.054},
                {"compute", 0.654},
                {"other", 0.067}}},
              {"verdict", "input-bound"}};
}

// One step record as steps.jsonl holds it: 0.25 s, a fifth of it waiting for input.
Json step_json(int step, int rank, double t) {
  return Json{{"step", step},        {"rank", rank},   {"t", t},         {"wall", 0.25},
              {"input", 0.05},       {"checkpoint", 0}, {"h2d", 0.002},  {"communication", 0.0},
              {"compute", 0.19},     {"other", 0.008}, {"samples", 400}, {"bytes", 45864000}};
}

Json sample_json(double t, double busy) {
  return Json{{"t", t},
              {"cpu", 0.71},
              {"proc_cpu", 1.3},
              {"rss", 812000000},
              {"mem_available", 20100000000.0},
              {"swap_in", 0},
              {"swap_out", 0},
              {"read_bps", 210000000},
              {"write_bps", 0},
              {"disk",
               {{"vda", {{"busy", busy}, {"queue", 31.2}, {"await_ms", 1.9}}},
                {"vdb", {{"busy", 0.01}, {"queue", 0.1}, {"await_ms", 0.4}}}}},
              {"threads", {{"running", 2}, {"io", 1}, {"sleeping", 9}}},
              {"gpu_util", nullptr}};
}

void write_jsonl(const std::string& path, const std::vector<Json>& lines) {
  std::string text;
  for (const Json& line : lines) text += line.dump() + "\n";
  write_file(path, text);
}

void write_run(const std::string& dir, const Json& run) {
  write_file(dir + "/run.json", run.dump(2));
}

// `steps` steps per rank from t = 1000, and system samples every `sample_every` s across them.
void write_steps_and_samples(const std::string& dir, int steps, int ranks,
                             double sample_every = 0.1) {
  std::vector<Json> lines;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < ranks; ++r) lines.push_back(step_json(s, r, 1000 + 0.25 * s));
  }
  write_jsonl(dir + "/steps.jsonl", lines);
  std::vector<Json> samples;
  for (int i = 0; i * sample_every < steps * 0.25; ++i) {
    samples.push_back(sample_json(1000 + sample_every * i, 0.9));
  }
  write_jsonl(dir + "/system.jsonl", samples);
}

Json doctor_findings() {
  Json findings = Json::array();
  for (int i = 0; i < 5; ++i) {
    findings.push_back({{"check", "storage.warn" + std::to_string(i)},
                        {"severity", "warn"},
                        {"summary", "warning number " + std::to_string(i)}});
  }
  findings.push_back({{"check", "memory.ok"}, {"severity", "ok"}, {"summary", "all fine"}});
  findings.push_back(
      {{"check", "storage.nfs_version"}, {"severity", "fail"}, {"summary", "NFS mounted vers=3"}});
  findings.push_back({{"check", "limits.open_files"},
                      {"status", "fail"},
                      {"summary", "open files limit 1024"},
                      {"subject", "/data"}});
  return findings;
}

ReportPage render_ok(const std::string& dir, const observe::ReportOptions& options = {}) {
  Result<ReportPage> page = render_report(dir, options);
  EXPECT_TRUE(page.is_ok()) << page.status().to_string();
  if (!page.is_ok()) throw std::runtime_error(page.status().to_string());
  return std::move(page).value();
}

TEST(Report, ProfileRunDrawsEverySectionWithItsBarsAndMarkers) {
  TempDir dir;
  Json run = base_run("profile");
  run["cost"] = {{"gpus", 8},
                 {"gpu_hourly_cost", 2.0},
                 {"per_day", {{"input", 76.03}, {"compute", 251.1}, {"other", 7.68}}},
                 {"per_year", {{"input", 27750.9}, {"compute", 91651.5}, {"other", 4708.5}}},
                 {"wait_per_day", 1234.4},
                 {"wait_per_year", 35806.5}};
  run["comparison"] = {{"before", "runs/before"},
                       {"saving_share", 0.31},
                       {"saving_per_day", 119.0},
                       {"saving_per_year", 43435.0}};
  run["events"] = {{{"t", 1003.0}, {"what", "compute share fell from 0.92 to 0.20"},
                    {"before", "disk queue 131 on vda; 3 threads blocked on I/O"}},
                   {{"t", 1009.5}, {"what", "checkpoint save started"}}};
  run["au"] = nullptr;
  run["doctor"] = doctor_findings();
  write_run(dir.path(), run);
  write_steps_and_samples(dir.path(), 50, 1);

  const ReportPage page = render_ok(dir.path());
  EXPECT_EQ(page.sections, (std::vector<std::string>{"summary", "where-time-went", "timeline",
                                                     "money", "doctor"}));
  EXPECT_EQ(page.summary.rfind("input-bound: ", 0), 0u) << page.summary;
  const std::string& html = page.html;
  EXPECT_EQ(html.find("id=\"au\""), std::string::npos);

  const std::string header = section(html, "summary");
  EXPECT_NE(header.find("Input-bound"), std::string::npos);
  EXPECT_NE(header.find("2026-12-03 08:00:00 UTC"), std::string::npos) << header;
  EXPECT_NE(header.find("zerowait profile resnet50 --data /data"), std::string::npos);

  // One bar for the whole run, one segment per cause with a share.
  const std::string shares = section(html, "where-time-went");
  EXPECT_EQ(count(shares, "<g class=\"bar\">"), 1u);
  EXPECT_EQ(count(shares, "<rect class=\"seg\""), 6u);
  EXPECT_NE(shares.find("19.8 %"), std::string::npos);
  EXPECT_NE(shares.find("12.1 s"), std::string::npos);

  const std::string timeline = section(html, "timeline");
  EXPECT_EQ(count(timeline, "<g class=\"bar\">"), 50u);
  EXPECT_EQ(count(timeline, "class=\"event\""), 2u);
  EXPECT_EQ(count(timeline, "<li>"), 2u);
  EXPECT_NE(timeline.find("Just before: disk queue 131 on vda"), std::string::npos);
  // The busiest device is the one charted.
  EXPECT_NE(timeline.find("Disk vda (busiest of 2): busy"), std::string::npos);
  EXPECT_EQ(timeline.find("Disk vdb"), std::string::npos);
  // disk busy, queue, read+write, rss+available, cpu, process cpu: gpu_util is all null.
  EXPECT_EQ(count(timeline, "<polyline class=\"series\""), 8u);
  EXPECT_EQ(timeline.find("GPU"), std::string::npos);

  const std::string money = section(html, "money");
  EXPECT_NE(money.find("$1,234/day"), std::string::npos) << money;
  EXPECT_NE(money.find("$35,806/year"), std::string::npos);
  EXPECT_NE(money.find("$76<"), std::string::npos);  // whole dollars from $10
  EXPECT_NE(money.find("$7.68"), std::string::npos);
  EXPECT_NE(money.find("31.0 % less GPU time"), std::string::npos);
  EXPECT_NE(money.find("$43,435/year saved"), std::string::npos);

  // Fail before warn, five at most, nothing that passed.
  const std::string doctor = section(html, "doctor");
  EXPECT_EQ(count(doctor, "<li class=\"finding\">"), 5u);
  EXPECT_LT(doctor.find("NFS mounted vers=3"), doctor.find("warning number 0"));
  EXPECT_NE(doctor.find("open files limit 1024"), std::string::npos);
  EXPECT_EQ(doctor.find("warning number 3"), std::string::npos);
  EXPECT_EQ(doctor.find("all fine"), std::string::npos);
  EXPECT_NE(doctor.find("2 more"), std::string::npos);

  // Self-contained: no script, no external resource or link.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
}

TEST(Report, EmulateRunDrawsAuPerConfigurationAgainstTheFloor) {
  TempDir dir;
  Json run = base_run("emulate");
  run["au"] = {{"value", 0.93}, {"floor", 0.90}, {"pass", true}, {"steps", 120},
               {"rule", "compute / wall over all steps but the first (MLPerf Storage)"}};
  run["throughput"] = {{"samples_per_s", 1790.0}, {"mb_per_s", 205.2}};
  run["rows"] = {{{"input", "zerowait"}, {"accelerators", 4}, {"au", 0.93}, {"floor", 0.9},
                  {"pass", true}, {"samples_per_s", 1790.0}, {"mb_per_s", 205.2}},
                 {{"input", "pytorch"}, {"accelerators", 4}, {"au", 0.41}, {"floor", 0.9},
                  {"pass", false}, {"samples_per_s", 790.0}, {"mb_per_s", 90.5}},
                 {{"input", "zerowait"}, {"accelerators", 8}, {"au", 0.91}, {"floor", 0.9},
                  {"pass", true}}};
  write_run(dir.path(), run);
  write_steps_and_samples(dir.path(), 30, 4);

  const ReportPage page = render_ok(dir.path());
  EXPECT_EQ(page.sections,
            (std::vector<std::string>{"summary", "where-time-went", "au", "timeline"}));
  EXPECT_NE(page.summary.find("AU 93.0 % (pass)"), std::string::npos) << page.summary;

  const std::string au = section(page.html, "au");
  EXPECT_EQ(count(au, "class=\"au-bar"), 3u);
  EXPECT_EQ(count(au, "class=\"au-bar fail\""), 1u);
  EXPECT_EQ(count(au, "class=\"floor\""), 3u);
  EXPECT_EQ(count(au, "✓ pass"), 2u);
  EXPECT_EQ(count(au, "✗ fail"), 1u);
  EXPECT_NE(au.find("pytorch · 4 accelerators"), std::string::npos);
  EXPECT_NE(au.find("1,790"), std::string::npos);

  // The whole run, then one bar per row (AU only: compute and the rest).
  const std::string shares = section(page.html, "where-time-went");
  EXPECT_EQ(count(shares, "<g class=\"bar\">"), 4u);

  // Four ranks: rank 0's 30 steps are drawn, and the page says so.
  const std::string timeline = section(page.html, "timeline");
  EXPECT_EQ(count(timeline, "<g class=\"bar\">"), 30u);
  EXPECT_NE(timeline.find("Rank 0 of 4 ranks is shown."), std::string::npos);
}

TEST(Report, WatchRunWithoutStepsDrawsTheMainThreadAndSystem) {
  TempDir dir;
  Json run = base_run("watch");
  run["events"] = {{{"t", 1001.0}, {"what", "main thread blocked in read()"}}};
  write_run(dir.path(), run);
  std::vector<Json> samples;
  for (int i = 0; i < 40; ++i) {
    Json sample = sample_json(1000 + 0.1 * i, i < 20 ? 0.2 : 0.95);
    sample["main"] = i < 20 ? "compute" : "input";
    sample["gpu_util"] = i < 20 ? 0.9 : 0.1;
    samples.push_back(sample);
  }
  write_jsonl(dir / "system.jsonl", samples);

  const ReportPage page = render_ok(dir.path());
  const std::string timeline = section(page.html, "timeline");
  ASSERT_FALSE(timeline.empty());
  EXPECT_NE(timeline.find("No steps.jsonl"), std::string::npos);
  EXPECT_EQ(count(timeline, "<g class=\"bar\">"), 0u);
  // Two runs of the same state: compute, then input.
  EXPECT_EQ(count(timeline, "class=\"main-state\""), 2u);
  EXPECT_NE(timeline.find("GPU: SM utilisation"), std::string::npos);
  EXPECT_EQ(count(timeline, "<polyline class=\"series\""), 9u);
  // Without a step chart the marker shows as a guide on each system chart, and in the list.
  EXPECT_EQ(count(timeline, "class=\"event-guide\""), 8u);
  EXPECT_EQ(count(timeline, "<li>"), 1u);
}

TEST(Report, TextFromTheRunIsEscaped) {
  TempDir dir;
  Json run = base_run("profile");
  run["title"] = "<script>alert('title')</script> & co";
  run["command"] = {"python", "train.py", "--name=<b>x</b>"};
  run["events"] = {{{"t", 1000.5}, {"what", "<img src=x onerror=alert(1)>"}}};
  run["doctor"] = {{{"check", "x.y"}, {"severity", "fail"}, {"summary", "<iframe>"}}};
  write_run(dir.path(), run);
  write_steps_and_samples(dir.path(), 4, 1);

  const std::string html = render_ok(dir.path()).html;
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<iframe"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  EXPECT_NE(html.find("<h1>&lt;script&gt;alert(&#39;title&#39;)&lt;/script&gt; &amp; co</h1>"),
            std::string::npos);
  EXPECT_NE(html.find("&lt;img src=x onerror=alert(1)&gt;"), std::string::npos);
}

TEST(Report, TenThousandStepsAreMergedIntoAtMostFourHundredBars) {
  TempDir dir;
  write_run(dir.path(), base_run("profile"));
  // A sample a second: 2,500 of them, four to each of the 600 columns a line can have. (Not
  // every 0.1 s: under ASan, writing and reading 25,000 samples took most of this test's time.)
  write_steps_and_samples(dir.path(), 10000, 1, 1.0);
  const std::string timeline = section(render_ok(dir.path()).html, "timeline");
  EXPECT_EQ(count(timeline, "<g class=\"bar\">"), observe::kMaxTimelineBars);
  EXPECT_NE(timeline.find("Each bar merges 25 neighbouring steps (10,000 steps drawn as 400 bars)"),
            std::string::npos);
  // System lines are averaged too: at most 600 points a line.
  const size_t first_line = timeline.find("<polyline class=\"series\"");
  ASSERT_NE(first_line, std::string::npos);
  const std::string points =
      timeline.substr(first_line, timeline.find("/>", first_line) - first_line);
  EXPECT_LE(count(points, ","), 601u);
  EXPECT_GE(count(points, ","), 500u);
}

// A StepProfiler that merged its rows (docs/observe.md, steps.jsonl `steps`): each row counts as
// the steps it covers, in the facts and in the bars' captions.
TEST(Report, MergedRowsCountEveryStepTheyCover) {
  TempDir dir;
  write_run(dir.path(), base_run("profile"));
  std::vector<Json> rows;
  for (int i = 0; i < 6; ++i) {
    Json row = step_json(4 * i, 0, 100.0 + i);
    row["steps"] = 4;
    rows.push_back(row);
  }
  write_jsonl(dir.path() + "/steps.jsonl", rows);
  const std::string html = render_ok(dir.path()).html;
  EXPECT_NE(html.find("24 recorded"), std::string::npos);
  EXPECT_NE(section(html, "timeline").find("Each bar merges neighbouring steps (24 steps drawn as "
                                           "6 bars)"),
            std::string::npos);
  EXPECT_NE(section(html, "timeline").find("steps 20–23"), std::string::npos);
}

TEST(Report, MinimalRunHasNoOptionalSections) {
  TempDir dir;
  // Only what every producer writes; seconds without shares, optional fields null.
  write_file(dir / "run.json",
             R"({"schema": "zerowait.run/1", "kind": "profile", "causes": ["input", "compute"],
                 "seconds": {"input": 1.0, "compute": 3.0}, "au": null, "cost": null,
                 "comparison": null, "events": null, "rows": null, "doctor": null})");
  const ReportPage page = render_ok(dir.path());
  EXPECT_EQ(page.sections, (std::vector<std::string>{"summary", "where-time-went"}));
  EXPECT_NE(page.html.find("25.0 %"), std::string::npos);  // input's share, from the seconds
  EXPECT_NE(page.html.find("Unknown"), std::string::npos);
}

Status render_error(const std::string& dir) {
  Result<ReportPage> page = render_report(dir);
  EXPECT_FALSE(page.is_ok());
  return page.status();
}

TEST(Report, ErrorsNameTheFileLineAndField) {
  TempDir dir;
  Status s = render_error(dir.path());
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find("no run.json in '" + dir.path() + "'"), std::string::npos)
      << s.message();

  write_file(dir / "run.json", "{\n  \"schema\": \"zerowait.run/1\",\n  \"kind\": profile\n}\n");
  s = render_error(dir.path());
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt);
  EXPECT_NE(s.message().find("'" + (dir / "run.json") + "': not JSON"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("line 3"), std::string::npos) << s.message();

  Json run = base_run("profile");
  run["schema"] = "zerowait.run/2";
  write_run(dir.path(), run);
  s = render_error(dir.path());
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("zerowait.run/2"), std::string::npos) << s.message();

  run = base_run("profile");
  run.erase("schema");
  write_run(dir.path(), run);
  EXPECT_NE(render_error(dir.path()).message().find("field 'schema' is missing"),
            std::string::npos);

  run = base_run("profile");
  run["seconds"]["input"] = "12 s";
  write_run(dir.path(), run);
  s = render_error(dir.path());
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt);
  EXPECT_NE(s.message().find("field 'seconds.input': expected a number, found \"12 s\""),
            std::string::npos)
      << s.message();

  run = base_run("emulate");
  run["rows"] = {{{"input", "zerowait"}, {"pass", "yes"}}};
  write_run(dir.path(), run);
  EXPECT_NE(render_error(dir.path()).message().find("field 'rows[0].pass'"), std::string::npos);

  write_run(dir.path(), base_run("profile"));
  const std::string steps = dir / "steps.jsonl";
  write_file(steps, step_json(0, 0, 1).dump() + "\n\n{\"step\": 1, \"wall\": 0.2,\n" +
                        step_json(2, 0, 1.5).dump() + "\n");
  s = render_error(dir.path());
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt);
  EXPECT_NE(s.message().find("'" + steps + "' line 3: not JSON"), std::string::npos)
      << s.message();

  Json bad_step = step_json(1, 0, 1.25);
  bad_step["wall"] = "slow";
  write_jsonl(steps, {step_json(0, 0, 1), bad_step});
  s = render_error(dir.path());
  EXPECT_NE(s.message().find("'" + steps + "' line 2: field 'wall': expected a number"),
            std::string::npos)
      << s.message();

  write_file(dir / "system.jsonl", "[1, 2]\n");
  write_jsonl(steps, {step_json(0, 0, 1)});
  s = render_error(dir.path());
  EXPECT_NE(s.message().find("system.jsonl' line 1: expected a JSON object"), std::string::npos)
      << s.message();
}

TEST(Report, AnUnfinishedLastLineIsLeftOutWithANote) {
  TempDir dir;
  write_run(dir.path(), base_run("profile"));
  // A producer killed mid-write: the last line has no newline and stops inside a value.
  write_file(dir / "steps.jsonl", step_json(0, 0, 1).dump() + "\n" + step_json(1, 0, 1.25).dump() +
                                      "\n{\"step\": 2, \"ra");
  const ReportPage page = render_ok(dir.path());
  EXPECT_EQ(count(section(page.html, "timeline"), "<g class=\"bar\">"), 2u);
  EXPECT_NE(page.html.find("(line 3) is incomplete and was left out"), std::string::npos);
}

TEST(ReportCli, WritesThePageAndPrintsItsPath) {
  TempDir dir;
  Json run = base_run("emulate");
  run["au"] = {{"value", 0.5}, {"floor", 0.9}, {"pass", false}};
  write_run(dir.path(), run);
  write_steps_and_samples(dir.path(), 8, 2);

  testing::CommandResult r = run_cli({"report", dir.path(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json out = Json::parse(r.out);
  EXPECT_EQ(out["report"], dir / "report.html");
  EXPECT_EQ(out["sections"],
            Json({"summary", "where-time-went", "au", "timeline"}));
  EXPECT_NE(read_file(dir / "report.html").find("id=\"au\""), std::string::npos);

  // -o elsewhere, and the doctor run now on a directory.
  TempDir elsewhere;
  r = run_cli({"report", dir.path(), "-o", elsewhere / "page.html", "--doctor", elsewhere.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), elsewhere / "page.html");
  EXPECT_NE(r.out.find("input-bound: "), std::string::npos) << r.out;
  const std::string page = read_file(elsewhere / "page.html");
  EXPECT_NE(page.find("id=\"doctor\""), std::string::npos);
  EXPECT_NE(page.find("Checked while this report was written"), std::string::npos);

  r = run_cli({"report", elsewhere / "missing"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("zerowait: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(elsewhere / "missing"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace zerowait
