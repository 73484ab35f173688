// Reading a run directory for the report. The files come from other programs (and possibly from
// a run that was killed), so every field is checked for its type and every error names the file,
// the line and the field.
#include "observe/report_run.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "common/file.hpp"

namespace zerowait::observe {
namespace {

using Json = nlohmann::ordered_json;

// Thrown inside this file only; read_run_directory turns it back into the Status it carries.
struct ParseFailure {
  Status status;
};

// A file, and the line in it for the JSON Lines files (0: the whole file).
struct Where {
  std::string path;
  size_t line = 0;
  std::string text() const {
    return "'" + path + "'" + (line == 0 ? "" : " line " + std::to_string(line));
  }
};

std::string shorten(std::string text) {
  constexpr size_t kMax = 60;
  if (text.size() > kMax) text = text.substr(0, kMax - 3) + "...";
  return text;
}

// nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error..."
// without the bracketed id; for a single-line record also without "line 1, ".
std::string parse_message(const std::string& what, bool single_line) {
  std::string text = what;
  const size_t bracket = text.find("] ");
  if (bracket != std::string::npos) text = text.substr(bracket + 2);
  if (single_line) {
    const size_t at = text.find("at line 1, ");
    if (at != std::string::npos) text.replace(at, 11, "at ");
  }
  return text;
}

// Typed access to one JSON object's fields; `prefix` names the enclosing fields in messages.
class Fields {
 public:
  Fields(const Json& object, const Where& where, std::string prefix = "")
      : object_(object), where_(where), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& expected,
                         const Json& found) const {
    throw ParseFailure{corrupt(where_.text() + ": field '" + prefix_ + key + "': expected " +
                               expected + ", found " + shorten(found.dump()))};
  }
  [[noreturn]] void missing(const std::string& key) const {
    throw ParseFailure{corrupt(where_.text() + ": field '" + prefix_ + key + "' is missing")};
  }

  // The member, or nullptr when absent or null.
  const Json* find(const std::string& key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  std::optional<double> number(const std::string& key) const {
    const Json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number()) fail(key, "a number", *value);
    return value->get<double>();
  }
  double required_number(const std::string& key) const {
    const std::optional<double> value = number(key);
    if (!value) missing(key);
    return *value;
  }
  std::optional<bool> boolean(const std::string& key) const {
    const Json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean()) fail(key, "true or false", *value);
    return value->get<bool>();
  }
  std::string text(const std::string& key) const {
    const Json* value = find(key);
    if (value == nullptr) return {};
    if (!value->is_string()) fail(key, "a string", *value);
    return value->get<std::string>();
  }
  std::vector<std::string> texts(const std::string& key) const {
    std::vector<std::string> out;
    const Json* value = find(key);
    if (value == nullptr) return out;
    if (!value->is_array()) fail(key, "a list of strings", *value);
    for (const Json& item : *value) {
      if (!item.is_string()) fail(key, "a list of strings", *value);
      out.push_back(item.get<std::string>());
    }
    return out;
  }
  // An object's members, or nullptr when absent or null.
  const Json* object(const std::string& key) const {
    const Json* value = find(key);
    if (value != nullptr && !value->is_object()) fail(key, "an object", *value);
    return value;
  }
  const Json* array(const std::string& key) const {
    const Json* value = find(key);
    if (value != nullptr && !value->is_array()) fail(key, "a list", *value);
    return value;
  }
  Fields nested(const Json& object, const std::string& key) const {
    return Fields(object, where_, prefix_ + key + ".");
  }
  // {"name": number, ...}; null members are left out.
  std::map<std::string, double> numbers(const std::string& key) const {
    std::map<std::string, double> out;
    const Json* value = object(key);
    if (value == nullptr) return out;
    const Fields inner = nested(*value, key);
    for (const auto& item : value->items()) {
      const std::optional<double> v = inner.number(item.key());
      if (v) out[item.key()] = *v;
    }
    return out;
  }
  // The keys of an object in file order (ordered_json keeps it).
  std::vector<std::string> keys(const std::string& key) const {
    std::vector<std::string> out;
    const Json* value = object(key);
    if (value == nullptr) return out;
    for (const auto& item : value->items()) out.push_back(item.key());
    return out;
  }
  const Where& where() const { return where_; }

 private:
  const Json& object_;
  const Where& where_;
  std::string prefix_;
};

Fields element(const Fields& parent, const Json& item, const std::string& key, size_t index) {
  if (!item.is_object()) parent.fail(key + "[" + std::to_string(index) + "]", "an object", item);
  return parent.nested(item, key + "[" + std::to_string(index) + "]");
}

std::vector<ReportFinding> read_findings(const Fields& run, const Json& list) {
  std::vector<ReportFinding> findings;
  for (size_t i = 0; i < list.size(); ++i) {
    const Fields f = element(run, list[i], "doctor", i);
    ReportFinding finding;
    finding.check = f.text("check");
    // The doctor's own JSON calls it "status"; docs/observe.md "severity". Either is read.
    finding.severity = f.text("severity");
    if (finding.severity.empty()) finding.severity = f.text("status");
    finding.summary = f.text("summary");
    finding.subject = f.text("subject");
    finding.fix = f.text("fix");
    findings.push_back(std::move(finding));
  }
  return findings;
}

RunInfo read_info(const Json& root, const Where& where) {
  if (!root.is_object()) {
    throw ParseFailure{corrupt(where.text() + ": expected a JSON object, found " +
                               shorten(root.dump()))};
  }
  const Fields run(root, where);
  const Json* schema = run.find("schema");
  if (schema == nullptr) {
    throw ParseFailure{corrupt(where.text() + ": field 'schema' is missing: not a zerowait run " +
                               "directory (expected \"" + kRunSchema + "\")")};
  }
  if (!schema->is_string()) run.fail("schema", "a string", *schema);
  if (schema->get<std::string>() != kRunSchema) {
    throw ParseFailure{unsupported(where.text() + ": field 'schema' is \"" +
                                   schema->get<std::string>() + "\"; this zerowait reads \"" +
                                   kRunSchema + "\"")};
  }
  RunInfo info;
  info.kind = run.text("kind");
  info.title = run.text("title");
  info.command = run.texts("command");
  info.started_unix = run.number("started_unix");
  info.duration_s = run.number("duration_s");
  info.causes = run.texts("causes");
  info.seconds = run.numbers("seconds");
  info.shares = run.numbers("shares");
  // A producer that left out `causes` still gave the order as the keys of seconds or shares.
  if (info.causes.empty()) info.causes = run.keys("seconds");
  if (info.causes.empty()) info.causes = run.keys("shares");
  if (info.causes.empty()) run.missing("causes");
  if (info.shares.empty()) {
    double total = 0;
    for (const auto& entry : info.seconds) total += entry.second;
    for (const auto& entry : info.seconds) {
      info.shares[entry.first] = total > 0 ? entry.second / total : 0;
    }
  }
  info.verdict = run.text("verdict");

  if (const Json* au = run.object("au")) {
    const Fields f = run.nested(*au, "au");
    info.au = RunAu{f.required_number("value"), f.number("floor"), f.boolean("pass"),
                    f.number("steps"), f.text("rule")};
  }
  if (const Json* throughput = run.object("throughput")) {
    const Fields f = run.nested(*throughput, "throughput");
    info.samples_per_s = f.number("samples_per_s");
    info.mb_per_s = f.number("mb_per_s");
  }
  if (const Json* cost = run.object("cost")) {
    const Fields f = run.nested(*cost, "cost");
    info.cost = RunCost{f.number("gpus"),          f.number("gpu_hourly_cost"),
                        f.numbers("per_day"),      f.numbers("per_year"),
                        f.number("wait_per_day"),  f.number("wait_per_year")};
  }
  if (const Json* comparison = run.object("comparison")) {
    const Fields f = run.nested(*comparison, "comparison");
    info.comparison = RunComparison{f.text("before"), f.number("saving_share"),
                                    f.number("saving_per_day"), f.number("saving_per_year")};
  }
  if (const Json* events = run.array("events")) {
    for (size_t i = 0; i < events->size(); ++i) {
      const Fields f = element(run, (*events)[i], "events", i);
      info.events.push_back(RunEvent{f.required_number("t"), f.text("what"), f.text("before")});
    }
  }
  if (const Json* rows = run.array("rows")) {
    for (size_t i = 0; i < rows->size(); ++i) {
      const Fields f = element(run, (*rows)[i], "rows", i);
      info.rows.push_back(RunRow{f.text("input"), f.number("accelerators"), f.number("au"),
                                 f.number("floor"), f.boolean("pass"), f.number("samples_per_s"),
                                 f.number("mb_per_s"), f.numbers("shares")});
    }
  }
  if (const Json* doctor = run.array("doctor")) info.doctor = read_findings(run, *doctor);
  if (const Json* advice = run.array("advice")) {
    for (size_t i = 0; i < advice->size(); ++i) {
      info.advice.push_back(element(run, (*advice)[i], "advice", i).text("summary"));
    }
  }
  return info;
}

StepRecord read_step(const Json& line, const Where& where, const std::vector<std::string>& causes,
                     const StepRecord* previous) {
  const Fields f(line, where);
  StepRecord step;
  step.step = static_cast<int64_t>(f.number("step").value_or(previous ? previous->step + 1 : 0));
  step.rank = static_cast<int64_t>(f.number("rank").value_or(0));
  double sum = 0;
  for (const std::string& cause : causes) {
    step.buckets.push_back(f.number(cause).value_or(0));
    sum += step.buckets.back();
  }
  step.wall = f.number("wall").value_or(sum);
  step.steps = std::max<int64_t>(1, static_cast<int64_t>(f.number("steps").value_or(1)));
  // Without `t` a step follows the one before it (such a log cannot line up with system.jsonl).
  const std::optional<double> t = f.number("t");
  step.t = t ? *t : (previous ? previous->t + previous->wall : 0);
  return step;
}

SystemRecord read_sample(const Json& line, const Where& where) {
  const Fields f(line, where);
  SystemRecord sample;
  sample.t = f.required_number("t");
  sample.cpu = f.number("cpu");
  sample.proc_cpu = f.number("proc_cpu");
  sample.rss = f.number("rss");
  sample.mem_available = f.number("mem_available");
  sample.read_bps = f.number("read_bps");
  sample.write_bps = f.number("write_bps");
  sample.gpu_util = f.number("gpu_util");
  sample.main = f.text("main");
  if (const Json* disks = f.object("disk")) {
    for (const auto& item : disks->items()) {
      if (item.value().is_null()) continue;
      if (!item.value().is_object()) f.fail("disk." + item.key(), "an object", item.value());
      const Fields d = f.nested(item.value(), "disk." + item.key());
      sample.disks.push_back(DiskRecord{item.key(), d.number("busy"), d.number("queue")});
    }
  }
  return sample;
}

// Calls `on_line(json, where)` for each non-blank line of a JSON Lines file. Returns false when
// the file does not exist.
template <typename OnLine>
bool read_json_lines(const std::string& path, std::vector<std::string>& notes, OnLine on_line) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return false;
  Result<std::string> bytes = internal::read_whole_file(path);
  if (!bytes.is_ok()) throw ParseFailure{bytes.status()};
  const std::string& text = bytes.value();
  size_t start = 0;
  size_t line_number = 0;
  while (start < text.size()) {
    ++line_number;
    size_t end = text.find('\n', start);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const Where where{path, line_number};
    Json record;
    try {
      record = Json::parse(line);
    } catch (const Json::parse_error& e) {
      if (!terminated) {
        notes.push_back("The last line of '" + path + "' (line " + std::to_string(line_number) +
                        ") is incomplete and was left out.");
        break;
      }
      throw ParseFailure{
          corrupt(where.text() + ": not JSON: " + parse_message(e.what(), /*single_line=*/true))};
    }
    if (!record.is_object()) {
      throw ParseFailure{
          corrupt(where.text() + ": expected a JSON object, found " + shorten(record.dump()))};
    }
    on_line(record, where);
  }
  return true;
}

}  // namespace

Result<RunRecord> read_run_directory(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return errno_status(errno, "cannot open run directory", dir);
  if (!S_ISDIR(st.st_mode)) {
    return invalid_argument("'" + dir + "' is not a run directory (a run directory holds " +
                            "run.json, steps.jsonl and system.jsonl)");
  }
  RunRecord record;
  record.dir = dir;
  const std::string run_path = dir + "/run.json";
  Result<std::string> text = internal::read_whole_file(run_path);
  if (!text.is_ok()) {
    return Status(text.status().code(),
                  "no run.json in '" + dir + "' (profile, watch and emulate write one): " +
                      text.status().message());
  }
  try {
    Json root;
    try {
      root = Json::parse(text.value());
    } catch (const Json::parse_error& e) {
      return corrupt("'" + run_path + "': not JSON: " + parse_message(e.what(), false));
    }
    record.info = read_info(root, Where{run_path, 0});
    const std::vector<std::string>& causes = record.info.causes;
    read_json_lines(dir + "/steps.jsonl", record.notes, [&](const Json& line, const Where& w) {
      const StepRecord* previous = record.steps.empty() ? nullptr : &record.steps.back();
      record.steps.push_back(read_step(line, w, causes, previous));
    });
    read_json_lines(dir + "/system.jsonl", record.notes, [&](const Json& line, const Where& w) {
      record.system.push_back(read_sample(line, w));
    });
  } catch (const ParseFailure& failure) {
    return failure.status;
  }
  return record;
}

}  // namespace zerowait::observe
