// `zerowait plan --nodes N ...`: what a job of N nodes asks of the object store, from the loader's
// real plan run for each node over a synthetic data set (src/loader/scale_plan.cpp).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "output.hpp"
#include "zerowait/loader/scale_plan.hpp"

namespace zerowait::cli {
namespace {

struct PlanArgs {
  ScalePlanOptions options;
  double samples = 0;  // a double, so that 1.28e6 reads as it is written
  uint64_t shard_bytes = 0;
  uint64_t cache_gib = 1024;
  std::string shuffle = "block";
  bool json = false;
};

std::string count(double value) { return internal::format_number(value); }

std::string bytes(double value) { return format_bytes(static_cast<uint64_t>(std::llround(value))); }

std::string ratio(double numerator, double denominator) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", denominator > 0 ? numerator / denominator : 0.0);
  return text;
}

nlohmann::ordered_json counts_json(const NodeEpochCounts& c) {
  return {{"samples", c.samples},
          {"cold_gets", c.cold_gets},
          {"cold_bytes", c.cold_bytes},
          {"useful_bytes", c.useful_bytes},
          {"warm_gets", c.warm_gets},
          {"shards_opened", c.shards_opened},
          {"cache_bytes_needed", c.cache_bytes_needed}};
}

nlohmann::ordered_json plan_json(const ScalePlan& p) {
  const ScalePlanOptions& o = p.options;
  return {{"nodes", o.nodes},
          {"gpus_per_node", o.gpus_per_node},
          {"simulated_nodes", p.simulated_nodes},
          {"samples", o.samples},
          {"sample_bytes", o.sample_bytes},
          {"shards", o.shards},
          {"dataset_bytes", p.dataset_bytes},
          {"block_bytes", o.shuffle.block_bytes},
          {"window_bytes", o.shuffle.window_bytes},
          {"redeal_every", o.shuffle.redeal_every},
          {"cache_block_bytes", o.cache_block_bytes},
          {"cache_bytes_per_node", o.cache_bytes_per_node},
          {"epochs", o.epochs},
          {"epoch_seconds", p.epoch_seconds},
          {"prefixes", o.prefixes},
          {"per_node_mean", counts_json(p.mean)},
          {"per_node_max", counts_json(p.max)},
          {"fetches_all_nodes", p.fetches_all_nodes},
          {"fetches_beyond_one", p.fetches_beyond_one},
          {"cold_gets_per_second", p.cold_gets_per_second},
          {"cold_bytes_per_second", p.cold_bytes_per_second},
          {"cold_bytes_per_second_per_node", p.cold_bytes_per_second_per_node},
          {"open_gets_per_second", p.open_gets_per_second},
          {"warm_gets_per_second", p.warm_gets_per_second},
          {"prefixes_used", p.prefixes_used},
          {"prefix_gets_per_second_max", p.prefix_gets_per_second_max},
          {"prefix_gets_per_second_mean", p.prefix_gets_per_second_mean},
          {"prefix_get_limit", o.prefix_get_limit},
          {"prefixes_needed", p.prefixes_needed},
          {"cold_epoch_store_seconds", p.cold_epoch_store_seconds},
          {"ckpt_bytes", p.ckpt_bytes},
          {"ckpt_bytes_per_second", p.ckpt_bytes_per_second},
          {"ckpt_bytes_per_node", p.ckpt_bytes_per_node},
          {"first_limit", p.first_limit}};
}

void print_plan(const ScalePlan& p) {
  const ScalePlanOptions& o = p.options;
  const std::string simulated =
      p.simulated_nodes == o.nodes
          ? "all " + count(o.nodes)
          : count(p.simulated_nodes) + " chosen at random, totals scaled by " +
                count(o.nodes) + "/" + count(p.simulated_nodes);
  print_key_values(
      std::cout,
      {{"nodes", count(o.nodes) + " x " + count(o.gpus_per_node) + " GPUs (simulated: " +
                     simulated + ")"},
       {"data set", count(static_cast<double>(o.samples)) + " samples x " +
                        bytes(static_cast<double>(o.sample_bytes)) + " in " +
                        count(static_cast<double>(o.shards)) + " shards, " +
                        bytes(static_cast<double>(p.dataset_bytes))},
       {"shuffle", "block " + bytes(static_cast<double>(o.shuffle.block_bytes)) + " (" +
                       count(static_cast<double>(p.samples_per_block)) + " samples), window " +
                       bytes(static_cast<double>(o.shuffle.window_bytes)) + ", " +
                       (o.shuffle.redeal_every == 0
                            ? "never redealt"
                            : "redealt every " + count(o.shuffle.redeal_every) + " epochs")},
       {"cache", bytes(static_cast<double>(o.cache_block_bytes)) + " blocks, " +
                     bytes(static_cast<double>(o.cache_bytes_per_node)) + " per node"},
       {"epoch", format_duration(p.epoch_seconds) + " (" + count(o.epochs) + " simulated)"}});

  std::cout << '\n';
  Table node(
      {{"per node per epoch", Align::kLeft}, {"mean", Align::kRight}, {"max", Align::kRight}});
  auto row = [&node](const std::string& what, const std::string& mean, const std::string& max) {
    node.add_row({what, mean, max});
  };
  row("samples", count(p.mean.samples), count(p.max.samples));
  row("GETs, cold epoch", count(p.mean.cold_gets), count(p.max.cold_gets));
  row("bytes fetched, cold", bytes(p.mean.cold_bytes), bytes(p.max.cold_bytes));
  row("bytes of samples", bytes(p.mean.useful_bytes), bytes(p.max.useful_bytes));
  row("fetched / sample bytes", ratio(p.mean.cold_bytes, p.mean.useful_bytes), "");
  row("GETs, warm epoch", count(p.mean.warm_gets), count(p.max.warm_gets));
  row("shards opened", count(p.mean.shards_opened), count(p.max.shards_opened));
  row("cache needed", bytes(p.mean.cache_bytes_needed), bytes(p.max.cache_bytes_needed));
  node.print(std::cout);

  std::cout << '\n';
  Table store({{"store, all nodes", Align::kLeft}, {"value", Align::kRight}, {"limit"}});
  const std::string limit = count(o.prefix_get_limit) + "/s per prefix";
  store.add_row({"block fetches, cold epoch", count(p.fetches_all_nodes),
                 count(static_cast<double>(p.dataset_blocks)) + " blocks in the data set"});
  store.add_row({"  by more than one node", count(p.fetches_beyond_one), ""});
  store.add_row({"data GETs/s, cold", count(p.cold_gets_per_second), ""});
  store.add_row({"shard-open GETs/s, cold", count(p.open_gets_per_second), "one per rank"});
  store.add_row({"bytes/s, cold", bytes(p.cold_bytes_per_second) + "/s", ""});
  store.add_row({"  per node", bytes(p.cold_bytes_per_second_per_node) + "/s", ""});
  store.add_row({"GETs/s, warm", count(p.warm_gets_per_second), ""});
  store.add_row({"GETs/s per prefix, max", count(p.prefix_gets_per_second_max), limit});
  store.add_row({"GETs/s per prefix, mean", count(p.prefix_gets_per_second_mean),
                 "over " + count(static_cast<double>(p.prefixes_used)) + " prefixes used"});
  store.add_row({"cold epoch at that limit", format_duration(p.cold_epoch_store_seconds),
                 "at least; the training rate: " + format_duration(p.epoch_seconds)});
  store.add_row({"checkpoint bytes", bytes(p.ckpt_bytes),
                 bytes(p.ckpt_bytes_per_node) + " per node"});
  store.add_row({"checkpoint bytes/s", bytes(p.ckpt_bytes_per_second) + "/s",
                 "every " + count(o.ckpt_every_minutes) + " min"});
  store.print(std::cout);
  std::cout << '\n' << p.first_limit << '\n';
}

int run_plan(PlanArgs& args) {
  ScalePlanOptions& o = args.options;
  if (!(args.samples >= 1) || args.samples != std::floor(args.samples)) {
    throw CliError("--samples must be a whole number of at least 1");
  }
  o.samples = static_cast<uint64_t>(args.samples);
  if (args.shard_bytes > 0) {
    const uint64_t per_shard = std::max<uint64_t>(1, args.shard_bytes / o.sample_bytes);
    o.shards = (o.samples + per_shard - 1) / per_shard;
  }
  o.shuffle.mode = unwrap(parse_shuffle_mode(args.shuffle));
  o.cache_bytes_per_node = args.cache_gib << 30;
  const ScalePlan plan = unwrap(plan_scale(o));
  if (args.json) {
    print_json(plan_json(plan));
  } else {
    print_plan(plan);
  }
  return kExitOk;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  ScalePlanOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand(
      "plan", "Store GETs, bytes and prefix load of an N-node job, from the loader's real plan");
  cmd->add_option("--nodes", o.nodes, "Nodes")->type_name("N")->check(integer_at_least(1))
      ->required();
  cmd->add_option("--gpus-per-node", o.gpus_per_node, "GPU ranks per node (one process each)")
      ->type_name("N")->check(integer_at_least(1))->default_str("8");
  cmd->add_option("--samples", args->samples, "Samples in the synthetic data set (1.28e6 works)")
      ->type_name("N")->required();
  add_size_option(cmd, "--sample-bytes", &o.sample_bytes, "Bytes of every sample")->required();
  auto* shards = cmd->add_option("--shards", o.shards, "Shards the samples are packed into")
                     ->type_name("N")->check(integer_at_least(1))->default_str("1");
  add_size_option(cmd, "--shard-bytes", &args->shard_bytes,
                  "Or: about this many bytes a shard (sets --shards)")
      ->excludes(shards);
  cmd->add_option("--shuffle", args->shuffle, "Loader shuffle (only block deals nodes shares)")
      ->type_name("MODE")->default_str("block");
  add_size_option(cmd, "--block-bytes", &o.shuffle.block_bytes, "Loader block (--shuffle block)")
      ->default_str("1M");
  add_size_option(cmd, "--window-bytes", &o.shuffle.window_bytes, "Loader shuffle window")
      ->default_str("256M");
  cmd->add_option("--redeal-every", o.shuffle.redeal_every,
                  "Epochs between new deals of blocks to nodes (0: never)")
      ->type_name("N")->check(integer_at_least(0))->default_str("0");
  cmd->add_option("--seed", o.shuffle.seed, "Shuffle seed")->type_name("N")->default_str("0");
  add_size_option(cmd, "--cache-block-bytes", &o.cache_block_bytes,
                  "Node-local cache block: one ranged GET each")
      ->default_str("4M");
  cmd->add_option("--cache-gib", args->cache_gib, "Node-local cache capacity per node, GiB")
      ->type_name("GIB")->check(integer_at_least(1))->default_str("1024");
  cmd->add_option("--epochs", o.epochs, "Epochs simulated (the first is cold)")
      ->type_name("N")->check(integer_at_least(1))->default_str("2");
  cmd->add_option("--epoch-seconds", o.epoch_seconds, "An epoch's duration")
      ->type_name("S")->check(quiet(CLI::PositiveNumber));
  cmd->add_option("--samples-per-second-per-gpu", o.samples_per_second_per_gpu,
                  "Or: each GPU's training rate, which gives the epoch's duration")
      ->type_name("R")->check(quiet(CLI::PositiveNumber));
  cmd->add_option("--prefixes", o.prefixes, "Key prefixes shards are spread over (pack: 65536)")
      ->type_name("N")->check(integer_at_least(1))->default_str("65536");
  cmd->add_option("--prefix-gets-per-second", o.prefix_get_limit,
                  "GETs/s one prefix serves (S3: about 5,500)")
      ->type_name("R")->check(quiet(CLI::PositiveNumber))->default_str("5500");
  cmd->add_option("--simulated-nodes", o.max_simulated_nodes,
                  "Simulate every node up to this many, else this many at random, scaled")
      ->type_name("N")->check(integer_at_least(1))->default_str("64");
  cmd->add_option("--ckpt-params", o.ckpt_params, "Model parameters checkpointed (70e9)")
      ->type_name("N")->check(quiet(CLI::NonNegativeNumber))->default_str("0");
  cmd->add_option("--ckpt-bytes-per-param", o.ckpt_bytes_per_param,
                  "Checkpoint bytes per parameter (16: bf16 weights + fp32 Adam state)")
      ->type_name("B")->check(quiet(CLI::NonNegativeNumber))->default_str("16");
  cmd->add_option("--ckpt-every-minutes", o.ckpt_every_minutes, "Minutes between checkpoints")
      ->type_name("M")->check(quiet(CLI::PositiveNumber))->default_str("30");
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "Examples:\n"
      "  zerowait plan --nodes 1000 --samples 1.28e6 --sample-bytes 110000 --shard-bytes 1G \\\n"
      "      --samples-per-second-per-gpu 2500 --ckpt-params 70e9\n"
      "  zerowait plan --nodes 3 --samples 1e5 --sample-bytes 100K --shards 10 --epoch-seconds 60 "
      "--json");
  return {cmd, [args] { return run_plan(*args); }};
}

}  // namespace zerowait::cli
