// `zerowait bench net`: all-reduce bandwidth, the path MTU between ranks and the halving test.
// The engine is C++, but torch.distributed (gloo, NCCL, DDP) is only reachable from Python, so
// this command checks its options, finds an interpreter with torch and execs
// `python -m zerowait.bench_net` with them (python/zerowait/bench_net.py does the work).
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "output.hpp"
#include "python_module.hpp"

namespace zerowait::cli {
namespace {

constexpr const char* kBenchNetModule = "zerowait.bench_net";

// Values live in the Python module (its argparse defaults); these hold the parse only.
struct NetArgs {
  unsigned ranks = 0;
  std::string backend;
  std::vector<std::string> sizes;
  unsigned iters = 0, warmup = 0, workers = 0, batch_size = 0, steps = 0;
  double compute_ms = 0, sample_ms = 0, timeout = 0;
  uint64_t grad_bytes = 0;
  std::string data;
  bool no_mtu_probe = false, halving = false, json = false;
};

}  // namespace

Command add_bench_net_command(CLI::App& bench) {
  auto args = std::make_shared<NetArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "net", "All-reduce bandwidth, path MTU between ranks, and what bounds a training step");
  cmd->add_option("--ranks", args->ranks, "Local ranks to start when not under torchrun")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("2");
  cmd->add_option("--backend", args->backend,
                  "auto: nccl when CUDA is available (a GPU per local rank), else gloo")
      ->type_name("auto|gloo|nccl")
      ->check(quiet(CLI::IsMember({"auto", "gloo", "nccl"})))
      ->default_str("auto");
  cmd->add_option("--sizes", args->sizes, "All-reduce message sizes")
      ->type_name("SIZE,...")
      ->delimiter(',')
      ->transform(quiet(CLI::AsSizeValue(false)))
      ->check(integer_at_least(1))
      ->default_str("4K,64K,1M,16M,64M");
  cmd->add_option("--iters", args->iters, "Timed all-reduces per size")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("20");
  cmd->add_option("--warmup", args->warmup, "Untimed all-reduces per size before those")
      ->type_name("N")
      ->check(integer_at_least(0))
      ->default_str("5");
  cmd->add_option("--compute-ms", args->compute_ms, "Compute per step beside the all-reduce")
      ->type_name("MS")
      ->check(quiet(CLI::NonNegativeNumber))
      ->default_str("100");
  add_size_option(cmd, "--grad-bytes", &args->grad_bytes, "Gradient bytes all-reduced per step")
      ->default_str("100M");
  cmd->add_flag("--no-mtu-probe", args->no_mtu_probe, "Skip the path-MTU probe between ranks");
  cmd->add_flag("--halving", args->halving,
                "Also time a DDP step with its input, without it, and without the all-reduce");
  cmd->add_option("--data", args->data,
                  "--halving input: a zerowait dataset (zerowait.Loader) or a directory of files "
                  "(torch DataLoader)")
      ->type_name("PATH")
      ->check(local_path("--data"));
  cmd->add_option("--workers", args->workers, "--halving input workers")
      ->type_name("N")
      ->check(integer_at_least(0))
      ->default_str("2");
  cmd->add_option("--batch-size", args->batch_size, "--halving samples per batch")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("8");
  cmd->add_option("--steps", args->steps, "--halving timed steps per variant")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("20");
  cmd->add_option("--sample-ms", args->sample_ms,
                  "--halving without --data: what each synthetic sample costs")
      ->type_name("MS")
      ->check(quiet(CLI::NonNegativeNumber))
      ->default_str("2");
  cmd->add_option("--timeout", args->timeout, "Seconds a rank waits for a peer before failing")
      ->type_name("S")
      ->check(quiet(CLI::PositiveNumber))
      ->default_str("120");
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) this process is one rank\n"
      "of that launch; otherwise it starts --ranks processes on 127.0.0.1. Rank 0 prints:\n"
      "  - all-reduce time, algbw and busbw (= algbw * 2(n-1)/n, as nccl-tests) per size, and\n"
      "    the share of a step that --grad-bytes all-reduced beside --compute-ms would take;\n"
      "  - the path MTU each way between rank 0 and every rank on another host (UDP with the\n"
      "    don't-fragment bit), naming a mismatch and the `ip link set ... mtu` that fixes it;\n"
      "  - with --halving: the step time with the input, without it and without the all-reduce,\n"
      "    and a verdict: input-, communication- or compute-bound (10 % threshold).\n"
      "Runs python -m zerowait.bench_net in $ZEROWAIT_PYTHON, else the python3 beside this\n"
      "executable, else python3 on PATH; it needs torch. Exit status 3 on an MTU mismatch.\n"
      "\n"
      "Examples:\n"
      "  zerowait bench net --sizes 1M,64M --iters 10\n"
      "  torchrun --nnodes 2 --nproc-per-node 8 ... -m zerowait.bench_net --halving --data /d");
  return {cmd, [cmd]() -> int {
            exec_python_module(kBenchNetModule, forwarded_args(*cmd), "zerowait bench net",
                               "torch.distributed");
          }};
}

}  // namespace zerowait::cli
