// `zerowait bench storage PATH`: O_DIRECT baselines of the storage under PATH, zerowait's io_uring
// and pread engines beside fio's run of the same jobs (src/diagnose/storage_bench.cpp).
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "output.hpp"
#include "zerowait/diagnose/cold_cache.hpp"
#include "zerowait/diagnose/storage_bench.hpp"

namespace zerowait::cli {
namespace {

struct StorageArgs {
  std::string path;
  uint64_t size = uint64_t{1} << 30;
  double runtime = 3;
  std::vector<unsigned> depths = {1, 32};
  bool no_fio = false;
  bool json = false;
};

// Set by SIGINT/SIGTERM: the library stops its job, kills fio and removes the test file.
std::atomic<bool> stop_requested{false};
volatile sig_atomic_t stop_signal = 0;

extern "C" void request_stop(int signal_number) {
  stop_signal = signal_number;
  stop_requested.store(true);  // lock-free: safe in a signal handler
}

// Routes SIGINT and SIGTERM to request_stop() while it lives, then restores what was there.
class StopOnSignals {
 public:
  StopOnSignals() {
    struct sigaction action {};
    action.sa_handler = request_stop;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopOnSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// Microseconds with the precision that still means something: "12.3", "456", "12345".
std::string micros(double us) { return format_fixed(us, us < 100 ? 1 : 0); }

// "seq read 1M", "rand read 4K".
std::string job_label(const StorageJob& job) {
  const char* what = job.pattern == StoragePattern::kSeqWrite  ? "seq write"
                     : job.pattern == StoragePattern::kSeqRead ? "seq read"
                                                               : "rand read";
  const uint64_t mib = uint64_t{1} << 20;
  const std::string block = job.block_size % mib == 0 ? std::to_string(job.block_size / mib) + "M"
                                                      : std::to_string(job.block_size >> 10) + "K";
  return std::string(what) + " " + block;
}

nlohmann::ordered_json measurement_json(const JobMeasurement& m) {
  return {{"mb_s", m.mb_s()},
          {"iops", m.iops()},
          {"bytes", m.bytes},
          {"ios", m.ios},
          {"seconds", m.seconds},
          {"lat_us", {{"p50", m.p50_us}, {"p99", m.p99_us}, {"p99_9", m.p999_us}}}};
}

void print_json_report(const StorageBenchReport& report) {
  nlohmann::ordered_json jobs = nlohmann::ordered_json::array();
  for (const StorageJobResult& r : report.jobs) {
    const std::optional<double> ratio = r.ratio_mb_s();
    jobs.push_back({{"name", r.job.name()},
                    {"rw", storage_pattern_rw(r.job.pattern)},
                    {"block_size", r.job.block_size},
                    {"depth", r.job.depth},
                    {"engine", storage_engine_name(r.job.engine)},
                    {"zerowait", measurement_json(r.zerowait)},
                    {"fio", r.fio ? measurement_json(*r.fio) : nlohmann::ordered_json(nullptr)},
                    {"ratio_mb_s", ratio ? nlohmann::ordered_json(*ratio) : nullptr}});
  }
  print_json(
      {{"path", report.dir},
       {"size", report.size},
       {"runtime", report.runtime_s},
       {"ramp", report.ramp_s},
       {"fio_slices", report.fio_slices},
       {"fio_version", report.fio_version.empty() ? nlohmann::ordered_json(nullptr)
                                                  : nlohmann::ordered_json(report.fio_version)},
       {"cold_cache", cold_cache_json(kColdByDirectIo)},
       {"notes", report.notes},
       {"jobs", std::move(jobs)}});
}

void print_table(const StorageBenchReport& report) {
  const bool fio = !report.fio_version.empty();
  std::cout << "storage under " << report.dir << ": a " << format_bytes(report.size)
            << " test file, O_DIRECT, " << format_fixed(report.runtime_s, 1)
            << " s per job and side"
            << " after a " << format_fixed(report.ramp_s, 2) << " s ramp"
            << (fio ? ", beside " + report.fio_version : std::string()) << "\n\n";
  std::vector<Table::Column> columns = {{"job"}, {"engine"}, {"QD", Align::kRight}};
  // Latencies are "zerowait / fio" per cell to keep the table narrow.
  const std::string pair = fio ? " (zw / fio)" : "";
  if (fio) {
    columns.insert(columns.end(), {{"zerowait MB/s", Align::kRight},
                                   {"fio MB/s", Align::kRight},
                                   {"ratio", Align::kRight},
                                   {"zerowait IOPS", Align::kRight},
                                   {"fio IOPS", Align::kRight}});
  } else {
    columns.insert(columns.end(), {{"MB/s", Align::kRight}, {"IOPS", Align::kRight}});
  }
  columns.insert(columns.end(), {{"p50 us" + pair, Align::kRight},
                                 {"p99 us" + pair, Align::kRight},
                                 {"p99.9 us" + pair, Align::kRight}});
  Table table(std::move(columns));
  for (const StorageJobResult& r : report.jobs) {
    const JobMeasurement& z = r.zerowait;
    std::vector<std::string> row = {job_label(r.job), storage_engine_name(r.job.engine),
                                    std::to_string(r.job.depth)};
    const auto latency = [&](double zw, double f) {
      return r.fio ? micros(zw) + " / " + micros(f) : micros(zw);
    };
    if (fio) {
      const std::optional<double> ratio = r.ratio_mb_s();
      row.insert(row.end(),
                 {format_fixed(z.mb_s(), 1), r.fio ? format_fixed(r.fio->mb_s(), 1) : "-",
                  ratio ? format_fixed(*ratio, 2) : "-", format_fixed(z.iops(), 0),
                  r.fio ? format_fixed(r.fio->iops(), 0) : "-"});
    } else {
      row.insert(row.end(), {format_fixed(z.mb_s(), 1), format_fixed(z.iops(), 0)});
    }
    const JobMeasurement f = r.fio.value_or(JobMeasurement{});
    row.insert(row.end(), {latency(z.p50_us, f.p50_us), latency(z.p99_us, f.p99_us),
                           latency(z.p999_us, f.p999_us)});
    table.add_row(std::move(row));
  }
  table.print(std::cout);
  std::cout << '\n';
  if (fio) {
    std::cout << "ratio = zerowait MB/s / fio MB/s (the same blocks: also the IOPS ratio). In "
                 "each job the sides\nalternated, zerowait first and last, fio in "
              << count_noun(report.fio_slices, "run", "runs")
              << ", so that a drift of the disk weighs on both.\n";
  }
  std::cout << "MB/s in decimal megabytes, as fio prints them; latency = submission to "
               "completion (fio's clat).\n";
  print_cold_cache(std::cout, kColdByDirectIo);
  for (const std::string& note : report.notes) std::cout << "note: " << note << '\n';
}

int run_storage(const StorageArgs& args) {
  StorageBenchOptions options;
  options.dir = args.path;
  options.size = args.size;
  options.runtime_s = args.runtime;
  options.random_depths = args.depths;
  options.use_fio = !args.no_fio;
  options.stop = &stop_requested;
  if (!args.json) {
    options.progress = [](const std::string& message) {
      std::cerr << "bench storage: " << message << std::endl;
    };
  }
  stop_requested = false;
  stop_signal = 0;
  Result<StorageBenchReport> report = [&] {
    StopOnSignals signals;
    return run_storage_bench(options);
  }();
  if (!report.is_ok() && stop_signal != 0) {  // whatever the error, the signal caused it
    throw CliError(std::string("stopped by ") + (stop_signal == SIGINT ? "SIGINT" : "SIGTERM") +
                   "; the test file under '" + args.path + "' was removed");
  }
  const StorageBenchReport result = unwrap(std::move(report));
  if (args.json) {
    print_json_report(result);
  } else {
    print_table(result);
  }
  return kExitOk;
}

}  // namespace

Command add_bench_storage_command(CLI::App& bench) {
  auto args = std::make_shared<StorageArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "storage", "O_DIRECT throughput, IOPS and latency of the storage under PATH, beside fio's");
  cmd->add_option("PATH", args->path, "A directory on the storage to measure")
      ->type_name("DIR")
      ->check(local_path("PATH", "bench storage measures a mounted file system"))
      ->required();
  add_size_option(cmd, "--size", &args->size,
                  "Size of the test file (rounded down to a multiple of 4 MiB)");
  cmd->add_option("--runtime", args->runtime, "Seconds each job is measured, per side")
      ->type_name("SECONDS")
      ->check(quiet(CLI::Range(0.001, 3600.0)))
      ->capture_default_str();
  cmd->add_option("--depths", args->depths, "Queue depths of the random-read jobs")
      ->type_name("N,N")
      ->delimiter(',')
      ->check(quiet(CLI::Range(1u, 1024u)))
      ->default_str("1,32");
  cmd->add_flag("--no-fio", args->no_fio, "Measure zerowait only, even where fio is installed");
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "Creates PATH/.zerowait-bench-<pid> of --size bytes, writes it whole, measures, and removes\n"
      "it, also on error and on Ctrl-C / SIGTERM (exit status 1). Refused when the filesystem\n"
      "has less free space than the size + 10 % + 1 GiB, or does not accept O_DIRECT.\n"
      "\n"
      "Jobs, all O_DIRECT, each time-based (after a ramp of a fifth of --runtime, at most\n"
      "0.5 s): sequential reads of 1 MiB blocks at queue depth 4; uniform random reads of 4 KiB\n"
      "and of 128 KiB at each of --depths; sequential writes of 1 MiB at depth 4, last (each\n"
      "write run ends with fdatasync). Each runs through io_uring (one thread, N requests in\n"
      "flight) and through psync (N threads, each with one pread/pwrite at a time: fio's\n"
      "numjobs=N; sequential threads each take a stripe of the file).\n"
      "\n"
      "Where fio is installed (and without --no-fio), fio runs every job on the same file in the\n"
      "same invocation (--direct=1, the same engine, depth, block size and runtime) and the table\n"
      "shows both and the ratio zerowait/fio: the disk of a VM varies from minute to minute, so\n"
      "the ratio is the number to read. The sides alternate within each job, zerowait first and\n"
      "last (fio in one run per 1.5 s of --runtime, up to 4), so a drift weighs on both. Both\n"
      "sides' buffers are in transparent huge pages (fio's through GLIBC_TUNABLES=\n"
      "glibc.malloc.hugetlb=1 and --mem_align=2M): in 4 KiB pages a large request's speed\n"
      "depends on how its pages happen to lie in physical memory (measured: 0.9 to 2.2 GB/s,\n"
      "fio against itself). Latency runs from submission to completion (fio's clat).\n"
      "\n"
      "The page cache is bypassed (O_DIRECT), not evicted: no root is needed, and the output\n"
      "says so (\"cold cache\"); the storage's own caches are not bypassed.\n"
      "\n"
      "--json prints {\"path\", \"size\", \"runtime\", \"ramp\", \"fio_slices\", \"fio_version\",\n"
      "\"cold_cache\": {\"method\", \"needs_root\", \"what\", \"stays_warm\"}, \"notes\", "
      "\"jobs\": [{\"name\", \"rw\", \"block_size\", \"depth\", \"engine\",\n"
      "\"zerowait\": {\"mb_s\", \"iops\", \"bytes\", \"ios\", \"seconds\", \"lat_us\": {\"p50\",\n"
      "\"p99\", \"p99_9\"}}, \"fio\": {the same} or null, \"ratio_mb_s\"}]}. MB/s are decimal.\n"
      "\n"
      "Example:\n"
      "  zerowait bench storage /data --size 4G --runtime 5 --depths 1,8,32");
  return {cmd, [args] { return run_storage(*args); }};
}

}  // namespace zerowait::cli
