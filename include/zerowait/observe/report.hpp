// `zerowait report`: one self-contained HTML page (inline CSS and SVG, no script, no external
// URL) drawn from a run directory that profile, watch or emulate wrote (docs/observe.md, schema
// "zerowait.run/1"): where the time went, AU against its floor, a per-step timeline beside the
// system's disk, I/O, memory and CPU, the money the waits cost, and the doctor's top findings.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::observe {

// One doctor finding as the report lists it: from run.json's "doctor", or from a doctor run now
// (the caller converts; observe/ may not include diagnose/).
struct ReportFinding {
  std::string check;     // "storage.atime"
  std::string severity;  // "fail", "warn", "info" or "ok"
  std::string summary;   // one line
  std::string subject;   // the path or device it is about; may be empty
  std::string fix;       // may be empty
};

struct ReportOptions {
  // When set, replaces run.json's "doctor" findings (`zerowait report RUN --doctor`).
  std::optional<std::vector<ReportFinding>> doctor;
  // Named in the page's footer ("zerowait 0.1.0").
  std::string generator = "zerowait";
};

struct ReportPage {
  std::string html;
  std::vector<std::string> sections;  // ids of the sections drawn, in page order
  std::string summary;                // one line: the verdict and the largest shares
};

// The timeline keeps at most this many step bars; beyond it neighbouring steps are merged.
inline constexpr size_t kMaxTimelineBars = 400;
// The doctor section lists at most this many findings (fail first, then warn).
inline constexpr size_t kMaxReportFindings = 5;

// Reads `run_dir` (run.json; steps.jsonl and system.jsonl when present) and renders the page.
// Errors name the file, the line and the field: kNotFound without run.json, kCorrupt for JSON
// that does not parse or a field of the wrong type, kUnsupported for another schema. Pure
// function of the files; safe to call from several threads.
Result<ReportPage> render_report(const std::string& run_dir, const ReportOptions& options = {});

}  // namespace zerowait::observe
