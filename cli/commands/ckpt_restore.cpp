// `zerowait ckpt restore DIR [--step N] [--mirror DIR]`: proves that a step restores, tensor by
// tensor, the way a training job's load() would: through restore_newest(), so the same copies are
// tried in the same order (the primary copy, its mirror copy, then older steps), every tensor is
// read and checked against its xxh3, and the tier each copy came from is reported.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <vector>

#include "commands/ckpt_common.hpp"
#include "common/clock.hpp"
#include "output.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/checkpoint/restore.hpp"

namespace zerowait::cli {
namespace {

using json = nlohmann::ordered_json;

constexpr const char* kRestoreDescription =
    "Restores one rank's part of a step the way load() does: the step's copy in DIR,\n"
    "then its copy in the mirror, then (without --step) older steps, until one reads\n"
    "back whole. Every tensor is read and checked against its xxh3; each copy tried is\n"
    "printed tensor by tensor with the tier it came from, and why it was given up.";

struct RestoreArgs {
  std::string dir;
  std::string mirror;
  uint64_t step = 0;
  CLI::Option* step_option = nullptr;
  uint32_t rank = 0;
  unsigned threads = 0;
  double read_timeout_s = internal::seconds(kDefaultReadTimeout);
  bool json = false;
};

struct TensorCheck {
  std::string name;
  uint64_t bytes = 0;
  Status status;  // ok, or why it did not restore
};

// One copy of a step that was tried, and what became of each of its tensors.
struct CopyReport {
  uint64_t step = 0;
  Tier tier = Tier::kPrimary;
  std::string path;  // the tier's root
  std::vector<TensorCheck> tensors;
  Status status;  // ok, or why the copy was given up
};

// Reads every tensor of `copy` one at a time into one reused buffer (memory stays at the size of
// the largest tensor), checking each. Returns the first failure, so the copy is given up; a
// failure other than a checksum mismatch (a stalled or failing read) ends the copy at once.
Status check_copy(const StepCopy& copy, const RestoreOptions& read, CopyReport* report) {
  std::vector<std::byte> buffer;
  Status first;
  for (size_t i = 0; i < copy.manifest->tensors.size(); ++i) {
    const StoredTensor& t = copy.manifest->tensors[i];
    buffer.resize(std::max<uint64_t>(buffer.size(), t.nbytes));
    TensorRead one{i, buffer.data(), false};
    Status s = read_tensors(*copy.target, *copy.manifest, std::span(&one, 1), read);
    report->tensors.push_back({t.name, t.nbytes, s});
    if (s.is_ok()) continue;
    if (first.is_ok()) first = s;
    if (s.code() != ErrorCode::kCorrupt) break;
  }
  return first;
}

json copy_json(const CopyReport& c) {
  json tensors = json::array();
  for (const TensorCheck& t : c.tensors) {
    tensors.push_back({{"name", t.name},
                       {"bytes", t.bytes},
                       {"ok", t.status.is_ok()},
                       {"error", t.status.is_ok() ? json(nullptr) : json(t.status.message())}});
  }
  return {{"step", c.step},
          {"tier", tier_name(c.tier)},
          {"path", c.path},
          {"ok", c.status.is_ok()},
          {"error", c.status.is_ok() ? json(nullptr) : json(c.status.message())},
          {"tensors", std::move(tensors)}};
}

void print_copy(const CopyReport& c) {
  uint64_t bytes = 0;
  for (const TensorCheck& t : c.tensors) bytes += t.bytes;
  std::cout << "step " << c.step << ", " << tier_name(c.tier) << " copy in " << c.path << ": "
            << (c.status.is_ok() ? "ok" : "FAILED") << " ("
            << count_noun(c.tensors.size(), "tensor", "tensors") << " read, " << format_bytes(bytes)
            << ")\n";
  if (!c.tensors.empty()) {
    Table table({{"result"}, {"tensor"}, {"bytes", Align::kRight}});
    for (const TensorCheck& t : c.tensors) {
      table.add_row({t.status.is_ok() ? "ok" : "FAILED", t.name, format_bytes(t.bytes)});
    }
    table.print(std::cout);
  }
  for (const TensorCheck& t : c.tensors) {
    if (!t.status.is_ok()) std::cout << "  " << t.status.message() << '\n';
  }
  if (!c.status.is_ok() && c.tensors.empty()) std::cout << "  " << c.status.message() << '\n';
  std::cout << '\n';
}

int run_restore(const RestoreArgs& args) {
  std::shared_ptr<Store> primary = open_checkpoint_directory(args.dir);
  std::shared_ptr<Store> mirror;
  if (!args.mirror.empty()) mirror = open_checkpoint_directory(args.mirror);
  const RestoreOptions read{args.threads, true, true, internal::from_seconds(args.read_timeout_s)};

  std::vector<CopyReport> copies;
  RestoreNewestOptions options;
  if (args.step_option->count() > 0) options.step = args.step;
  options.rank = args.rank;
  options.on_skip = [&](const SkippedCopy& skipped, uint64_t, Tier) {
    // A copy whose tensors were read already has its report; one given up before (its manifest,
    // or a step the primary does not hold) gets one here.
    if (copies.empty() || copies.back().step != skipped.step ||
        copies.back().tier != skipped.tier) {
      Store& target = skipped.tier == Tier::kPrimary ? *primary : *mirror;
      copies.push_back({skipped.step, skipped.tier, target.describe(), {}, {}});
    }
    copies.back().status = skipped.why;
  };
  const auto start = std::chrono::steady_clock::now();
  Result<RestoredStep> restored =
      restore_newest(*primary, mirror.get(), options, [&](const StepCopy& copy) {
        copies.push_back({copy.step, copy.tier, copy.target->describe(), {}, {}});
        copies.back().status = check_copy(copy, read, &copies.back());
        return copies.back().status;
      });
  const double seconds = seconds_since(start);
  if (!restored.is_ok() && copies.empty()) check(restored.status());  // nothing was tried
  if (!restored.is_ok() && copies.back().status.is_ok()) copies.back().status = restored.status();
  uint64_t bytes = 0;
  if (restored.is_ok()) {
    for (const TensorCheck& t : copies.back().tensors) bytes += t.bytes;
  }

  if (args.json) {
    json tried = json::array();
    for (const CopyReport& c : copies) tried.push_back(copy_json(c));
    print_json({{"path", primary->describe()},
                {"mirror", mirror ? json(mirror->describe()) : json(nullptr)},
                {"rank", args.rank},
                {"ok", restored.is_ok()},
                {"step", restored.is_ok() ? json(restored.value().step) : json(nullptr)},
                {"tier", restored.is_ok() ? json(tier_name(restored.value().tier)) : json(nullptr)},
                {"error", restored.is_ok() ? json(nullptr) : json(restored.status().message())},
                {"copies", std::move(tried)},
                {"bytes", bytes},
                {"seconds", seconds}});
    return restored.is_ok() ? kExitOk : kExitProblems;
  }
  for (const CopyReport& c : copies) print_copy(c);
  if (!restored.is_ok()) {
    std::cout << "FAILED: rank " << args.rank << " does not restore from "
              << (args.step_option->count() > 0 ? "step " + std::to_string(args.step)
                                                : "any committed step")
              << ": " << restored.status().message() << '\n';
    return kExitProblems;
  }
  const RestoredStep& r = restored.value();
  std::cout << "ok: step " << r.step << " (rank " << args.rank << ") restores from the "
            << tier_name(r.tier) << " copy in " << copies.back().path << ": "
            << count_noun(copies.back().tensors.size(), "tensor", "tensors") << ", "
            << format_bytes(bytes) << " read and verified in " << format_duration(seconds) << ", "
            << format_rate(bytes, seconds);
  if (!r.skipped.empty()) {
    std::cout << " (" << count_noun(r.skipped.size(), "copy", "copies") << " skipped)";
  }
  std::cout << '\n';
  return kExitOk;
}

}  // namespace

Command add_ckpt_restore_command(CLI::App* ckpt) {
  auto args = std::make_shared<RestoreArgs>();
  CLI::App* restore = ckpt->add_subcommand(
      "restore", "Prove that a step restores: read and check every tensor, from either tier");
  add_directory_argument(restore, &args->dir);
  args->step_option = restore
                          ->add_option("--step", args->step,
                                       "Step to restore (default: the newest that restores, "
                                       "as load() picks it)")
                          ->type_name("N")
                          ->check(integer_at_least(0));
  restore->add_option("--mirror", args->mirror, "The mirror tier, tried when a copy is damaged")
      ->type_name("DIR");
  restore->add_option("--rank", args->rank, "The rank whose part is restored (default 0)")
      ->type_name("R")
      ->check(integer_at_least(0));
  restore
      ->add_option("--read-timeout", args->read_timeout_s,
                   "Seconds one read may take before it is reported")
      ->type_name("S")
      ->capture_default_str()
      ->check(quiet(CLI::PositiveNumber));
  add_threads_option(restore, &args->threads);
  add_json_flag(restore, &args->json);
  restore->footer(help_footer(kRestoreDescription, "no copy of the step restores",
                              "zerowait ckpt restore /ckpt --step 1000 --mirror /nfs/ckpt"));
  return {restore, [args] { return run_restore(*args); }};
}

}  // namespace zerowait::cli
