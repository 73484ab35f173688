// zw_bench_plan: what planning an epoch costs at scale. For a data set of N samples in shards of
// 10^6, it builds the epoch order (`EpochOrder`) and one rank's partition (rank 3 of 8, batches
// of 256), then measures the time to the first batch's indices, the resident memory it added
// (VmRSS before and after, and the peak, VmHWM), and a resume at 60 % of the epoch with another
// world size. The reference, in the same run, is what the order used to be and what a
// DataLoader's RandomSampler does: a permutation array of N entries (8 bytes each), shuffled with
// Fisher-Yates — measured at --array-samples (default 10^8, 800 MB), since 10^9 would take 8 GB.
//
//   zw_bench_plan [--samples N] [--array-samples N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "zerowait/loader/sample_plan.hpp"

namespace zerowait {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A /proc/self/status field in KiB ("VmRSS", "VmHWM").
uint64_t status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0)
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return 0;
}

struct Row {
  std::string what;
  uint64_t samples = 0;
  double first_batch_s = 0;
  double resume_s = 0;
  double rss_growth_mib = 0;
  double peak_growth_mib = 0;
};

Row plan_without_array(uint64_t samples) {
  Row row{"zerowait random order (Feistel, no per-sample memory)", samples};
  const uint64_t rss = status_kib("VmRSS"), peak = status_kib("VmHWM");
  const Clock::time_point start = Clock::now();
  const std::vector<uint64_t> shards(samples / 1000000, 1000000);
  auto order = std::make_shared<const EpochOrder>(
      shards, ShuffleOptions{ShuffleMode::kRandom, 1, 64, 256}, 0);
  RankPartition partition(order, 0, PartitionOptions{256, 3, 8, false});
  std::vector<uint64_t> batch;
  partition.batch(0, &batch);
  row.first_batch_s = seconds_since(start);
  const Clock::time_point resume = Clock::now();
  const uint64_t position = partition.position_after(partition.batch_count() * 6 / 10);
  RankPartition resumed(order, position, PartitionOptions{512, 1, 4, false});
  resumed.batch(0, &batch);
  row.resume_s = seconds_since(resume);
  row.rss_growth_mib = (static_cast<double>(status_kib("VmRSS")) - static_cast<double>(rss)) / 1024;
  row.peak_growth_mib =
      (static_cast<double>(status_kib("VmHWM")) - static_cast<double>(peak)) / 1024;
  if (batch.size() != 512)
    std::fprintf(stderr, "zw_bench_plan: a resumed batch of %zu\n", batch.size());
  return row;
}

Row plan_with_array(uint64_t samples) {
  Row row{"permutation array + Fisher-Yates (RandomSampler's way)", samples};
  const uint64_t rss = status_kib("VmRSS"), peak = status_kib("VmHWM");
  const Clock::time_point start = Clock::now();
  std::vector<uint64_t> order(samples);
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::mt19937_64 rng(1);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint64_t> batch(order.begin() + 3 * 256, order.begin() + 4 * 256);
  row.first_batch_s = seconds_since(start);
  row.resume_s = 0;  // a position into the same array
  row.rss_growth_mib = (static_cast<double>(status_kib("VmRSS")) - static_cast<double>(rss)) / 1024;
  row.peak_growth_mib =
      (static_cast<double>(status_kib("VmHWM")) - static_cast<double>(peak)) / 1024;
  if (batch.empty() || order.empty()) std::fprintf(stderr, "zw_bench_plan: empty\n");
  return row;
}

}  // namespace
}  // namespace zerowait

int main(int argc, char** argv) {
  uint64_t samples = 1000000000, array_samples = 100000000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--samples")
      samples = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--array-samples")
      array_samples = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: zw_bench_plan [--samples N] [--array-samples N]\n");
      return 2;
    }
  }
  samples = std::max<uint64_t>(1000000, samples / 1000000 * 1000000);
  const zerowait::Row feistel = zerowait::plan_without_array(samples);
  const zerowait::Row array = zerowait::plan_with_array(array_samples);
  std::printf("%-56s %14s %14s %12s %12s %12s\n", "plan (rank 3 of 8, batches of 256)", "samples",
              "first batch s", "resume s", "RSS +MiB", "peak +MiB");
  for (const zerowait::Row& r : {feistel, array}) {
    std::printf("%-56s %14llu %14.6f %12.6f %12.1f %12.1f\n", r.what.c_str(),
                static_cast<unsigned long long>(r.samples), r.first_batch_s, r.resume_s,
                r.rss_growth_mib, r.peak_growth_mib);
  }
  const double scale = static_cast<double>(samples) / static_cast<double>(array_samples);
  std::printf("\nratios at equal size (the array's numbers scaled by %.0fx, linear in samples):\n",
              scale);
  std::printf("  first batch: zerowait %.6f s vs array %.1f s  -> %.0fx sooner\n",
              feistel.first_batch_s, array.first_batch_s * scale,
              array.first_batch_s * scale / std::max(1e-9, feistel.first_batch_s));
  std::printf("  memory:      zerowait %.1f MiB vs array %.0f MiB\n", feistel.peak_growth_mib,
              array.peak_growth_mib * scale);
  return 0;
}
