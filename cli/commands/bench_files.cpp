// `zerowait bench files DIR [--dataset SHARDS]`: what one open/fstat/read/close per small file
// costs, cold and warm, beside the same samples read from the packed dataset
// (src/diagnose/files_bench.cpp).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "output.hpp"
#include "zerowait/diagnose/files_bench.hpp"
#include "zerowait/diagnose/cold_cache.hpp"
#include "zerowait/host/page_cache.hpp"

namespace zerowait::cli {
namespace {

struct FilesArgs {
  std::string dir;
  std::string dataset;
  uint64_t max_files = 0;
  unsigned threads = kFilesBenchThreads;
  unsigned repeats = kFilesBenchRepeats;
  uint64_t seed = 0;
  bool packed_first = false;
  bool json = false;
};

nlohmann::ordered_json pass_json(const ReadPass& pass) {
  return {{"items", pass.items},
          {"bytes", pass.bytes},
          {"seconds", pass.seconds},
          {"items_per_s", pass.items_per_s()},
          {"mb_s", pass.mb_s()},
          {"resident_before", pass.resident_before}};
}

void print_json_report(const FilesBenchReport& report) {
  nlohmann::ordered_json packed = nullptr;
  if (report.packed) {
    const PackedFilesBench& p = *report.packed;
    packed = {{"dataset", p.dataset},
              {"samples", p.dataset_samples},
              {"io", p.io},
              {"open_seconds", p.open_seconds},
              {"loader_start_seconds", p.loader_start_seconds},
              {"cold", pass_json(p.cold)},
              {"warm", pass_json(p.warm)},
              {"speedup_cold", p.speedup_cold},
              {"speedup_warm", p.speedup_warm}};
  }
  print_json({{"dir", report.dir},
              {"threads", report.threads},
              {"repeats", report.repeats},
              {"files_listed", report.files_listed},
              {"list_seconds", report.list_seconds},
              {"list_files_per_s",
               report.list_seconds > 0 ? double(report.files_listed) / report.list_seconds : 0.0},
              {"files_read", report.files_read},
              {"files", {{"cold", pass_json(report.cold)}, {"warm", pass_json(report.warm)}}},
              {"packed", std::move(packed)},
              {"cold_cache", cold_cache_json(kColdByFadvise)},
              {"notes", report.notes}});
}

void print_table(const FilesBenchReport& report) {
  const std::optional<PackedFilesBench>& packed = report.packed;
  std::cout << "listed " << report.files_listed << " files under " << report.dir << " in "
            << format_duration(report.list_seconds) << " ("
            << format_fixed(double(report.files_listed) / std::max(report.list_seconds, 1e-9), 0)
            << " files/s)\n";
  if (packed) {
    std::cout << "opened " << packed->dataset << " (" << packed->dataset_samples
              << " samples) in " << format_duration(packed->open_seconds)
              << "; the loader started in " << format_duration(packed->loader_start_seconds)
              << " (once per training process; not in the passes)\n";
  }
  std::cout << "read " << report.files_read << (packed ? " files / samples" : " files")
            << " per pass, shuffled, " << count_noun(report.threads, "thread", "threads")
            << (packed ? " on each side" : "") << "; the fastest of "
            << count_noun(report.repeats, "pass", "passes") << " of each kind\n\n";
  std::vector<Table::Column> columns = {
      {"pass"}, {"files/s", Align::kRight}, {"MB/s", Align::kRight}};
  if (packed) {
    columns.insert(columns.end(), {{"packed samples/s", Align::kRight},
                                   {"packed MB/s", Align::kRight},
                                   {"speed-up", Align::kRight}});
  }
  Table table(std::move(columns));
  const auto row = [&](const std::string& name, const ReadPass& files, const ReadPass* samples,
                       double speedup) {
    std::vector<std::string> cells = {name, format_fixed(files.items_per_s(), 0),
                                      format_fixed(files.mb_s(), 1)};
    if (samples != nullptr) {
      cells.insert(cells.end(),
                   {format_fixed(samples->items_per_s(), 0), format_fixed(samples->mb_s(), 1),
                    format_fixed(speedup, 1) + "x"});
    }
    table.add_row(std::move(cells));
  };
  row("cold", report.cold, packed ? &packed->cold : nullptr, packed ? packed->speedup_cold : 0);
  row("warm", report.warm, packed ? &packed->warm : nullptr, packed ? packed->speedup_warm : 0);
  table.print(std::cout);
  std::cout << "\nper file: open + fstat + read to the end + close.";
  if (packed) {
    std::cout << " packed: zerowait's Loader as zerowait.Loader\nreads by default (io \"auto\": "
              << packed->io << " here), raw bytes of every field, shuffle \"random\", "
              << "checksums verified.\nspeed-up = samples/s over files/s, cold against cold, "
                 "warm against warm; both sides at this\ncommand's priority, each evicted "
                 "right before its cold pass, the fastest of the repeats kept.";
  }
  std::cout << "\n";
  print_cold_cache(std::cout, kColdByFadvise);
  // What the eviction left: the evidence that "cold" was cold.
  const auto share = [](double resident) {
    return std::isnan(resident) ? std::string("unknown") : format_fixed(resident * 100, 1) + " %";
  };
  std::cout << "  in the page cache when the cold pass began: "
            << share(report.cold.resident_before) << " of the files' bytes"
            << (packed ? ", " + share(packed->cold.resident_before) + " of the shards'"
                       : std::string())
            << ".\n";
  if (std::isnan(report.cold.resident_before) ||
      (packed && std::isnan(packed->cold.resident_before))) {
    std::cout << "  unknown: " << kUnmeasuredResidency << ".\n";
  }
  for (const std::string& note : report.notes) std::cout << "note: " << note << '\n';
}

int run_files(const FilesArgs& args) {
  FilesBenchOptions options;
  options.dir = args.dir;
  options.dataset = args.dataset;
  options.max_files = args.max_files;
  options.threads = args.threads;
  options.seed = args.seed;
  options.repeats = args.repeats;
  options.packed_first = args.packed_first;
  if (!args.json) {
    options.progress = [](const std::string& message) {
      std::cerr << "bench files: " << message << std::endl;
    };
  }
  const FilesBenchReport report = unwrap(run_files_bench(options));
  if (args.json) {
    print_json_report(report);
  } else {
    print_table(report);
  }
  return kExitOk;
}

}  // namespace

Command add_bench_files_command(CLI::App& bench) {
  auto args = std::make_shared<FilesArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "files", "The cost of small files: per-file reads against the dataset packed from them");
  cmd->add_option("DIR", args->dir, "The tree of small files (an ImageFolder, ...)")
      ->type_name("DIR")
      ->check(local_path("DIR"))
      ->required();
  cmd->add_option("--dataset", args->dataset,
                  "The dataset packed from DIR (zerowait pack DIR -o SHARDS --imagefolder)")
      ->type_name("SHARDS")
      ->check(local_path("--dataset"));
  cmd->add_option("--max-files", args->max_files,
                  "Read at most N files and N samples per pass (a random subset; 0 = all)")
      ->type_name("N")
      ->check(integer_at_least(0))
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Threads reading, on each side")
      ->type_name("N")
      ->check(quiet(CLI::Range(1u, 1024u)))
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the shuffled orders")
      ->type_name("N")
      ->capture_default_str();
  cmd->add_option("--repeats", args->repeats,
                  "Cold and warm passes on each side; each side's fastest is kept")
      ->type_name("N")
      ->check(quiet(CLI::Range(1u, 100u)))
      ->capture_default_str();
  cmd->add_flag("--packed-first", args->packed_first,
                "The packed side reads first in the first repeat (the sides swap every repeat)");
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "Lists DIR (files/s), then reads every file (or --max-files of them) in a shuffled order\n"
      "as a Dataset over loose files does: open, fstat, read to the end, close. Cold first, then\n"
      "warm (the second pass). Before the cold pass each file is evicted from the page cache\n"
      "(fdatasync, then posix_fadvise(POSIX_FADV_DONTNEED)), which needs no root: this drops\n"
      "those files' cached pages for everyone on the machine. The kernel's dentry and inode\n"
      "caches stay warm. The output says so (\"cold cache\", and the share of the bytes still\n"
      "cached when the cold pass began).\n"
      "\n"
      "With --dataset, the same number of samples is read from the packed dataset the way\n"
      "training reads it: through zerowait's Loader (shuffle \"random\", raw bytes of every\n"
      "field, checksums verified, io \"auto\": io_uring where the kernel allows it, else\n"
      "pread; the table names the one used), with --threads worker threads, cold (its shard\n"
      "files evicted the same way) and warm.\n"
      "\n"
      "The comparison is fair both ways:\n"
      "- same threads: each side reads with --threads threads (the loader's consumer only\n"
      "  collects batches; the per-file side's caller only waits);\n"
      "- same priority: both at this command's, as a DataLoader's workers run. (zerowait's\n"
      "  Loader normally runs its workers as SCHED_BATCH at nice +5, to yield to the training\n"
      "  loop; here that would only yield to other work on the machine, and per-file readers\n"
      "  made SCHED_BATCH lose a time slice after every read on a busy machine);\n"
      "- each side is evicted right before its own cold pass and its residency measured then,\n"
      "  so what the other side's pass left in the page cache cannot warm it;\n"
      "- the passes alternate (files cold, packed cold, files warm, packed warm) and the side\n"
      "  that goes first swaps every repeat (--packed-first: the packed side in the first);\n"
      "- each side keeps its fastest of --repeats passes of each kind: other work on the\n"
      "  machine only ever slows a pass; the residency shown is the highest of the cold passes;\n"
      "- both rates count from the first read to the last item: the loader's first batch is\n"
      "  inside its pass.\n"
      "The loader's start-up (its batch memory faulted in, once per training process) is\n"
      "reported apart, outside the passes. A dataset with a different sample count is fine:\n"
      "the rates are per file and per sample.\n"
      "\n"
      "--json prints {\"dir\", \"threads\", \"repeats\", \"files_listed\", \"list_seconds\",\n"
      "\"list_files_per_s\", \"files_read\", \"files\": {\"cold\", \"warm\"}, \"packed\":\n"
      "{\"dataset\", \"samples\", \"io\", \"open_seconds\", \"loader_start_seconds\", \"cold\",\n"
      "\"warm\", \"speedup_cold\", \"speedup_warm\"} or null, \"cold_cache\": {\"method\",\n"
      "\"needs_root\", \"what\", \"stays_warm\"}, \"notes\"}, each pass {\"items\", \"bytes\",\n"
      "\"seconds\", \"items_per_s\", \"mb_s\", \"resident_before\"}.\n"
      "\n"
      "Example:\n"
      "  zerowait generate imagefolder /tmp/jpegs --files 20000\n"
      "  zerowait pack /tmp/jpegs -o /tmp/shards --imagefolder\n"
      "  zerowait bench files /tmp/jpegs --dataset /tmp/shards");
  return {cmd, [args] { return run_files(*args); }};
}

}  // namespace zerowait::cli
