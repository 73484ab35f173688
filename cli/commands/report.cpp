// `zerowait report RUN`: a run directory of profile, watch or emulate drawn as one self-contained
// HTML page (src/observe/report_html.cpp draws it; docs/report.md describes it).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common/file.hpp"
#include "output.hpp"
#include "zerowait/diagnose/doctor.hpp"
#include "zerowait/observe/report.hpp"

namespace zerowait::cli {
namespace {

struct ReportArgs {
  std::string run;
  std::string output;
  std::vector<std::string> doctor_paths;
  bool json = false;
};

// The doctor runs here, not in observe/, which may not include diagnose/.
std::vector<observe::ReportFinding> doctor_findings(const std::vector<std::string>& paths) {
  doctor::DoctorOptions options;
  options.paths = paths.empty() ? std::vector<std::string>{"."} : paths;
  std::vector<observe::ReportFinding> findings;
  for (const doctor::Finding& f : doctor::run_doctor(options).findings) {
    findings.push_back({f.check, doctor::severity_name(f.severity), f.summary, f.subject, f.fix});
  }
  return findings;
}

}  // namespace

Command add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Draw a run directory (profile, watch, emulate) as one self-contained HTML page");
  cmd->add_option("RUN", args->run, "Run directory: run.json, and steps.jsonl, system.jsonl")
      ->type_name("DIR")
      ->check(local_path("RUN"))
      ->required();
  cmd->add_option("-o,--output", args->output, "Where to write the page (default: RUN/report.html)")
      ->type_name("FILE")
      ->check(local_path("--output"));
  CLI::Option* doctor =
      cmd->add_option("--doctor", args->doctor_paths,
                      "Run the doctor now on PATH... (default: .) and list its top findings "
                      "instead of those recorded in run.json; put it last")
          ->type_name("PATH")
          ->check(local_path("--doctor"))
          ->expected(0, CLI::detail::expected_max_vector_size);
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "The page needs no script and no network: inline CSS and SVG, every text escaped.\n"
      "Sections (each only when the run has something for it):\n"
      "  summary          title, kind, command, start, duration; the verdict in large type\n"
      "  where-time-went  the wall time's shares by cause as a bar (and one per emulate row)\n"
      "  au               accelerator utilisation per configuration against its floor\n"
      "  timeline         per-step bars (at most 400, neighbours merged) over the system's\n"
      "                   disk busy and queue, process I/O, memory and CPU on the same time\n"
      "                   axis, with the run's events marked and listed\n"
      "  money            what each cause costs per day and per year, and the saving\n"
      "                   against an earlier run\n"
      "  doctor           the top 5 findings (fail, then warn) from run.json or --doctor\n"
      "\n"
      "Examples:\n"
      "  zerowait report runs/resnet50\n"
      "  zerowait report runs/resnet50 -o /tmp/resnet50.html --doctor /data/train");
  return {cmd, [args, doctor]() -> int {
            observe::ReportOptions options;
            options.generator = "zerowait " ZEROWAIT_VERSION;
            if (doctor->count() != 0) options.doctor = doctor_findings(args->doctor_paths);
            const observe::ReportPage page = unwrap(observe::render_report(args->run, options));
            const std::string path =
                args->output.empty() ? args->run + "/report.html" : args->output;
            check(internal::write_file_atomic(path, page.html, /*sync=*/false));
            if (args->json) {
              print_json({{"report", path},
                          {"sections", page.sections},
                          {"summary", page.summary}});
            } else {
              std::cout << path << '\n' << page.summary << '\n';
            }
            return kExitOk;
          }};
}

}  // namespace zerowait::cli
