// `zerowait ckpt ls|verify|inspect|gc DIR`: checkpoints from the command line: which steps are
// committed, whether they are intact, what a step holds, and removing what no step needs
// (`ckpt inspect` is in ckpt_inspect.cpp, `ckpt restore` in ckpt_restore.cpp, `ckpt export` in
// ckpt_export.cpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_manifest.hpp"
#include "commands.hpp"
#include "commands/ckpt_common.hpp"
#include "common/file.hpp"
#include "output.hpp"
#include "progress_bar.hpp"
#include "zerowait/checkpoint/checkpointer.hpp"
#include "zerowait/checkpoint/maintenance.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait::cli {
namespace {

// How many step numbers an error message lists.
constexpr size_t kStepsShown = 20;

using json = nlohmann::ordered_json;

std::vector<std::string> step_texts(const std::vector<uint64_t>& steps) {
  std::vector<std::string> texts;
  for (uint64_t step : steps) texts.push_back(std::to_string(step));
  return texts;
}

// --- ls ----------------------------------------------------------------------------------------

// A step directory that is not a committed checkpoint.
struct UncommittedDir {
  std::string name;  // "step-7.tmp", "step-3"
  uint64_t step = 0;
  // "unfinished": a .tmp newer than the newest committed step (a job may still be writing it);
  // "orphaned": any other .tmp; "retired": a step whose commit record retention removed.
  std::string state;
  uint64_t files = 0;
  uint64_t bytes = 0;
  std::vector<uint64_t> referenced_by;  // retired: committed steps that still use its files
};

// Counts the files directly in `dir->name` (step directories are flat). A file that vanishes
// meanwhile (a save or gc running) is not counted.
void measure_directory(Store& target, UncommittedDir* dir) {
  Result<std::vector<std::string>> names = target.list(dir->name, metadata_deadline());
  if (!names.is_ok() && names.status().code() == ErrorCode::kNotFound) return;
  for (const std::string& name : unwrap(std::move(names))) {
    const std::string path = dir->name + "/" + name;
    Result<bool> is_dir = target.is_directory(path, metadata_deadline());
    if (is_dir.is_ok() && is_dir.value()) continue;
    Result<uint64_t> size = target.size(path, metadata_deadline());
    if (!size.is_ok() && size.status().code() == ErrorCode::kNotFound) continue;
    dir->bytes += unwrap(std::move(size));
    dir->files += 1;
  }
}

std::vector<UncommittedDir> find_uncommitted(Store& target,
                                             const std::vector<uint64_t>& committed) {
  std::vector<UncommittedDir> found;
  for (const std::string& name : unwrap(target.list("", metadata_deadline()))) {
    bool tmp = false;
    std::optional<uint64_t> step = internal::parse_step_directory(name, &tmp);
    if (!step) continue;
    if (!tmp && std::binary_search(committed.begin(), committed.end(), *step)) continue;
    if (!unwrap(target.is_directory(name, metadata_deadline()))) continue;
    UncommittedDir dir;
    dir.name = name;
    dir.step = *step;
    dir.state = "retired";
    if (tmp) {
      const bool settled = !committed.empty() && *step <= committed.back();
      dir.state = settled ? "orphaned" : "unfinished";
    }
    measure_directory(target, &dir);
    found.push_back(std::move(dir));
  }
  std::sort(found.begin(), found.end(), [](const UncommittedDir& a, const UncommittedDir& b) {
    return std::pair(a.step, a.name) < std::pair(b.step, b.name);
  });
  return found;
}

struct ListedStep {
  uint64_t step = 0;
  std::optional<StepInfo> info;
  std::string problem;  // why `info` could not be read
};

std::string uncommitted_note(const UncommittedDir& dir) {
  if (dir.state == "unfinished") {
    return "newer than every committed step: a job may still be writing it";
  }
  if (dir.state == "orphaned") return "a save that never committed; gc removes it";
  if (dir.referenced_by.empty()) return "no manifest.json, nothing references it; gc removes it";
  return "no manifest.json; its files are still used by step " + references_text(dir.referenced_by);
}

int run_ls(const CkptArgs& args) {
  std::shared_ptr<Store> target = open_checkpoint_directory(args.dir);
  const std::vector<uint64_t> committed = unwrap(list_steps(*target));
  std::vector<ListedStep> steps;
  for (uint64_t step : committed) {
    Result<StepInfo> info = read_step_info(*target, step);
    if (info.is_ok()) {
      steps.push_back({step, std::move(info).value(), {}});
    } else {
      steps.push_back({step, std::nullopt, info.status().message()});
    }
  }
  std::vector<UncommittedDir> uncommitted = find_uncommitted(*target, committed);
  for (UncommittedDir& dir : uncommitted) {
    if (dir.state != "retired") continue;
    for (const ListedStep& s : steps) {
      if (!s.info) continue;
      const auto& refs = s.info->references;
      if (std::find(refs.begin(), refs.end(), dir.step) != refs.end()) {
        dir.referenced_by.push_back(s.step);
      }
    }
  }
  const bool problems =
      std::any_of(steps.begin(), steps.end(), [](const ListedStep& s) { return !s.info; });

  if (args.json) {
    json out_steps = json::array();
    for (const ListedStep& s : steps) {
      json entry = {{"step", s.step}, {"newest", s.step == committed.back()}};
      if (s.info) {
        entry.update({{"run_id", s.info->run_id},
                      {"world_size", s.info->world_size},
                      {"bytes_total", s.info->bytes_total},
                      {"bytes_stored", s.info->bytes_stored},
                      {"references", json(s.info->references)},
                      {"created", s.info->created}});
      } else {
        entry["error"] = s.problem;
      }
      out_steps.push_back(std::move(entry));
    }
    json out_uncommitted = json::array();
    for (const UncommittedDir& dir : uncommitted) {
      out_uncommitted.push_back({{"name", dir.name},
                                 {"step", dir.step},
                                 {"state", dir.state},
                                 {"files", dir.files},
                                 {"bytes", dir.bytes},
                                 {"referenced_by", json(dir.referenced_by)}});
    }
    print_json({{"path", target->describe()},
                {"newest", committed.empty() ? json(nullptr) : json(committed.back())},
                {"steps", std::move(out_steps)},
                {"not_committed", std::move(out_uncommitted)}});
    return problems ? kExitProblems : kExitOk;
  }

  if (committed.empty()) {
    std::cout << "no committed checkpoints in " << target->describe() << '\n';
  } else {
    std::cout << count_noun(committed.size(), "committed step", "committed steps") << " in "
              << target->describe() << ", newest " << committed.back() << "\n\n";
    Table table({{"step"},
                 {"ranks", Align::kRight},
                 {"tensor bytes", Align::kRight},
                 {"stored", Align::kRight},
                 {"references"},
                 {"created"},
                 {"run"}});
    for (const ListedStep& s : steps) {
      std::string step = std::to_string(s.step);
      if (s.step == committed.back()) step += " (newest)";
      if (!s.info) {
        table.add_row({step, "-", "-", "-", "-", "unreadable: " + s.problem, "-"});
        continue;
      }
      table.add_row({step, std::to_string(s.info->world_size), format_bytes(s.info->bytes_total),
                     format_bytes(s.info->bytes_stored), references_text(s.info->references),
                     s.info->created, s.info->run_id.empty() ? "-" : s.info->run_id});
    }
    table.print(std::cout);
  }
  if (!uncommitted.empty()) {
    std::cout << "\nnot committed:\n";
    Table table(
        {{"directory"}, {"state"}, {"files", Align::kRight}, {"bytes", Align::kRight}, {"note"}});
    for (const UncommittedDir& dir : uncommitted) {
      table.add_row({dir.name, dir.state, std::to_string(dir.files), format_bytes(dir.bytes),
                     uncommitted_note(dir)});
    }
    table.print(std::cout);
  }
  return problems ? kExitProblems : kExitOk;
}

// --- verify ------------------------------------------------------------------------------------

// The bytes verify_step will read for `step` (every rank's files, older steps' included), or 0
// when a manifest cannot be read (verify_step reports why).
uint64_t bytes_to_verify(Store& target, uint64_t step) {
  Result<std::vector<RankManifest>> manifests = read_rank_manifests(target, step);
  if (!manifests.is_ok()) return 0;
  std::set<std::string> seen;
  uint64_t bytes = 0;
  for (const RankManifest& manifest : manifests.value()) {
    for (const StoredFile& file : manifest.files) {
      if (seen.insert(file.path).second) bytes += file.bytes;
    }
  }
  return bytes;
}

int run_verify(const CkptArgs& args) {
  std::shared_ptr<Store> target = open_checkpoint_directory(args.dir);
  std::vector<uint64_t> steps;
  if (args.step_option->count() > 0) {
    require_committed(*target, args.dir, args.step);
    steps.push_back(args.step);
  } else {
    steps = unwrap(list_steps(*target));
    std::reverse(steps.begin(), steps.end());  // newest first: the one a resume would load
  }

  const auto start = std::chrono::steady_clock::now();
  std::vector<VerifyReport> reports;
  {
    ProgressBar progress("verify", "");
    uint64_t total = 0;
    for (uint64_t step : steps) total += bytes_to_verify(*target, step);
    std::atomic<uint64_t> done{0};
    auto on_bytes = [&](uint64_t bytes) { progress.update(0, 0, done += bytes, total); };
    for (uint64_t step : steps) {
      Result<VerifyReport> report = verify_step(*target, step, args.threads, on_bytes);
      if (report.is_ok()) {
        reports.push_back(std::move(report).value());
      } else if (report.status().code() == ErrorCode::kCorrupt) {
        // A commit record too damaged to read is a finding (exit 3), not a failure of verify.
        reports.push_back({step, 0, 0, 0, {report.status().message()}});
      } else {
        check(report.status());
      }
    }
  }
  const double seconds = seconds_since(start);
  uint64_t bytes = 0;
  uint64_t files = 0;
  size_t bad = 0;
  for (const VerifyReport& r : reports) {
    bytes += r.bytes;
    files += r.files;
    if (!r.problems.empty()) ++bad;
  }

  if (args.json) {
    json out_steps = json::array();
    for (const VerifyReport& r : reports) {
      out_steps.push_back({{"step", r.step},
                           {"ok", r.problems.empty()},
                           {"files", r.files},
                           {"tensors", r.tensors},
                           {"bytes", r.bytes},
                           {"problems", r.problems}});
    }
    print_json({{"path", target->describe()},
                {"ok", bad == 0},
                {"steps", std::move(out_steps)},
                {"bytes", bytes},
                {"seconds", seconds}});
    return bad == 0 ? kExitOk : kExitProblems;
  }

  if (reports.empty()) {
    std::cout << "no committed checkpoints in " << target->describe() << ": nothing to verify\n";
    return kExitOk;
  }
  for (const VerifyReport& r : reports) {
    std::cout << "step " << r.step << ": " << (r.problems.empty() ? "ok" : "FAILED") << " ("
              << count_noun(r.files, "file", "files") << ", "
              << count_noun(r.tensors, "tensor", "tensors") << ", " << format_bytes(r.bytes)
              << ")\n";
    for (const std::string& problem : r.problems) std::cout << "  " << problem << '\n';
  }
  std::cout << (bad == 0 ? "ok: " : "FAILED: ") << "verified "
            << count_noun(reports.size(), "step", "steps") << " ("
            << count_noun(files, "file", "files") << ", " << format_bytes(bytes) << ") in "
            << format_duration(seconds) << ", " << format_rate(bytes, seconds) << ": "
            << count_noun(bad, "bad step", "bad steps") << '\n';
  return bad == 0 ? kExitOk : kExitProblems;
}

// --- gc ----------------------------------------------------------------------------------------

int run_gc(const CkptArgs& args) {
  std::shared_ptr<Store> target = open_checkpoint_directory(args.dir);
  const std::vector<uint64_t> before = unwrap(list_steps(*target));
  const GcReport report =
      unwrap(collect_garbage(*target, args.keep_last, args.keep_every, !args.all_tmp));
  const std::vector<uint64_t> kept = unwrap(list_steps(*target));
  std::vector<uint64_t> retired;
  std::set_difference(before.begin(), before.end(), kept.begin(), kept.end(),
                      std::back_inserter(retired));
  // What gc left alone on purpose: a .tmp a running job may still be writing.
  std::vector<std::string> unfinished;
  for (const UncommittedDir& dir : find_uncommitted(*target, kept)) {
    if (dir.state == "unfinished") unfinished.push_back(dir.name);
  }

  if (args.json) {
    print_json({{"path", target->describe()},
                {"removed", report.removed},
                {"bytes_freed", report.bytes_freed},
                {"retired_steps", retired},
                {"kept_steps", kept},
                {"kept_unfinished", unfinished}});
    return kExitOk;
  }
  for (const std::string& path : report.removed) std::cout << "removed " << path << '\n';
  for (const std::string& name : unfinished) {
    std::cout << "kept " << name
              << ": newer than every committed step, a job may still be writing it "
                 "(--all-tmp removes it)\n";
  }
  std::cout << (report.removed.empty() ? "nothing to remove"
                                       : "freed " + format_bytes(report.bytes_freed))
            << "; " << count_noun(kept.size(), "committed step", "committed steps") << " kept";
  if (!retired.empty()) {
    std::cout << ", retired " << (retired.size() == 1 ? "step " : "steps ")
              << references_text(retired);
  }
  std::cout << '\n';
  return kExitOk;
}

// --- registration ------------------------------------------------------------------------------

CLI::Option* add_step_argument(CLI::App* command, CkptArgs* args, const std::string& description) {
  return command->add_option("STEP", args->step, description)
      ->type_name("STEP")
      ->check(integer_at_least(0));
}

}  // namespace

std::string references_text(const std::vector<uint64_t>& steps) {
  return steps.empty() ? "-" : join_limited(step_texts(steps), steps.size());
}

void require_committed(Store& target, const std::string& dir, uint64_t step) {
  const std::vector<uint64_t> steps = unwrap(list_steps(target));
  if (std::binary_search(steps.begin(), steps.end(), step)) return;
  const std::string name = step_directory(step);
  std::string message =
      "step " + std::to_string(step) + " is not a committed checkpoint in '" + dir + "'";
  if (unwrap(target.exists(name + internal::kTempSuffix, metadata_deadline()))) {
    message += " (" + name + internal::kTempSuffix + " is a save that did not commit)";
  } else if (unwrap(target.is_directory(name, metadata_deadline()))) {
    message += " (" + name + " was retired: it has no " + internal::kCommitRecordName + ")";
  }
  if (steps.empty()) {
    message += "; there are no committed checkpoints";
  } else {
    message += "; committed steps: " + join_limited(step_texts(steps), kStepsShown);
  }
  throw CliError(message);
}

std::shared_ptr<Store> open_checkpoint_directory(const std::string& dir) {
  check(require_writable_store(dir, "checkpoint directory"));
  std::shared_ptr<Store> target = unwrap(open_store(dir));
  if (!unwrap(target->exists("", metadata_deadline()))) {
    throw CliError("checkpoint directory '" + dir + "' does not exist");
  }
  if (!unwrap(target->is_directory("", metadata_deadline())))
    throw CliError("'" + dir + "' is not a directory");
  return target;
}

std::string help_footer(const std::string& description, const std::string& problems,
                        const std::string& example) {
  return description +
         "\n\nExit codes: 0 success, 1 error (the message names the directory, step or file),\n"
         "2 usage error" +
         (problems.empty() ? "" : ", 3 " + problems) + ".\n\nExample:\n  " + example;
}

void add_directory_argument(CLI::App* command, std::string* dir) {
  command
      ->add_option("DIR", *dir,
                   "Checkpoint directory (holds step-N/ directories), or s3://BUCKET/PREFIX")
      ->type_name("DIR")
      ->required();
}

Command add_ckpt_command(CLI::App& app) {
  auto args = std::make_shared<CkptArgs>();
  CLI::App* ckpt = app.add_subcommand(
      "ckpt", "List, verify, inspect, restore, export and clean up checkpoints (zerowait.Checkpointer)");
  ckpt->require_subcommand(1);
  ckpt->footer(
      "Run 'zerowait ckpt COMMAND --help' for a command's arguments.\n"
      "\n"
      "Examples:\n"
      "  zerowait ckpt ls /ckpt\n"
      "  zerowait ckpt verify /ckpt\n"
      "  zerowait ckpt inspect /ckpt 1000 --rank 0\n"
      "  zerowait ckpt restore /ckpt --mirror /nfs/ckpt\n"
      "  zerowait ckpt export /ckpt 1000 --to safetensors -o model.safetensors\n"
      "  zerowait ckpt gc /ckpt --keep-last 3");

  CLI::App* ls = ckpt->add_subcommand("ls",
                                      "List committed steps, and step directories that are "
                                      "not committed");
  add_directory_argument(ls, &args->dir);
  add_json_flag(ls, &args->json);
  ls->footer(help_footer(
      "Each committed step shows its ranks, tensor bytes, the bytes stored in its own\n"
      "files (an incremental save stores less), the older steps whose files it uses,\n"
      "and when it was committed; the newest is marked. Directories that are not\n"
      "committed are listed apart: step-N.tmp saves that never committed (or are still\n"
      "being written) and retired steps without manifest.json.",
      "a commit record could not be read", "zerowait ckpt ls /ckpt --json"));

  CLI::App* verify = ckpt->add_subcommand(
      "verify", "Check every file of a step (or of every committed step) against its checksums");
  add_directory_argument(verify, &args->dir);
  args->step_option =
      add_step_argument(verify, args.get(), "Step to verify (default: every committed step)");
  add_json_flag(verify, &args->json);
  add_threads_option(verify, &args->threads);
  verify->footer(
      help_footer("Reads every file of every rank, newest step first, and checks sizes,\n"
                  "safetensors headers and xxh3 checksums; a damaged file is named with the\n"
                  "tensors in it that no longer match.",
                  "a step is damaged", "zerowait ckpt verify /ckpt 1000"));

  CLI::App* inspect =
      ckpt->add_subcommand("inspect", "Show the tensors and files of one committed step");
  add_directory_argument(inspect, &args->dir);
  add_step_argument(inspect, args.get(), "Committed step to show")->required();
  add_json_flag(inspect, &args->json);
  args->rank_option = inspect->add_option("--rank", args->rank, "Show only this rank's part")
                          ->type_name("R")
                          ->check(integer_at_least(0));
  inspect->footer(
      help_footer("For each rank: every tensor's name, dtype, shape, bytes, stored bytes,\n"
                  "codec and file (an incremental save's unchanged tensors live in an older\n"
                  "step's file), then the files with their sizes. --json adds offsets,\n"
                  "checksums and the saved structure.",
                  "", "zerowait ckpt inspect /ckpt 1000 --json"));

  CLI::App* gc =
      ckpt->add_subcommand("gc", "Remove what no committed step needs, optionally retiring steps");
  add_directory_argument(gc, &args->dir);
  CLI::Option* keep_last =
      gc->add_option("--keep-last", args->keep_last,
                     "Retire all but the newest N committed steps (0: retire none)")
          ->type_name("N")
          ->check(integer_at_least(0));
  gc->add_option("--keep-every", args->keep_every,
                 "With --keep-last, also keep every step that is a multiple of K")
      ->type_name("K")
      ->check(integer_at_least(1))
      ->needs(keep_last);
  gc->add_flag("--all-tmp", args->all_tmp,
               "Also remove step-N.tmp newer than the newest committed step (only when no job "
               "is writing)");
  add_json_flag(gc, &args->json);
  gc->footer(
      help_footer("Removes step-N.tmp directories of saves that never committed (by default only\n"
                  "those at or below the newest committed step: a newer one may be a save in\n"
                  "progress), and the files of retired steps that no committed step references.\n"
                  "Files an incremental save still uses are kept.",
                  "", "zerowait ckpt gc /ckpt --keep-last 3 --keep-every 10000"));

  const Command restore = add_ckpt_restore_command(ckpt);
  const Command exporter = add_ckpt_export_command(ckpt);

  return {ckpt, [args, ls, verify, inspect, gc, restore, exporter]() -> int {
            if (restore.app->parsed()) return restore.run();
            if (exporter.app->parsed()) return exporter.run();
            if (ls->parsed()) return run_ls(*args);
            if (verify->parsed()) return run_verify(*args);
            if (inspect->parsed()) return run_inspect(*args);
            if (gc->parsed()) return run_gc(*args);
            return kExitUsage;  // unreachable: require_subcommand(1)
          }};
}

}  // namespace zerowait::cli
