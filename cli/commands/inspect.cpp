// `zerowait inspect PATH`: what a dataset or shard holds, from its manifest (or its footers).
#include <iostream>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "output.hpp"
#include "zerowait/shard/format.hpp"

namespace zerowait::cli {
namespace {

// How many class names the human summary lists.
constexpr size_t kClassesShown = 8;

struct InspectArgs {
  std::string path;
  bool json = false;
  bool shards = false;
};

// Format details read from the shard itself; only gathered for a single-shard dataset, so that
// inspecting a manifest of 10,000 shards still reads one file.
struct ShardFormatInfo {
  std::string kind;      // "zerowait" or "webdataset-tar"
  uint32_t version = 0;  // native shards only
  bool aligned = false;
  bool checksums = false;
};

ShardFormatInfo shard_format_info(const ShardReader& reader) {
  ShardFormatInfo info;
  info.kind = reader.kind() == ShardKind::kTar ? "webdataset-tar" : "zerowait";
  // The reader refuses any version but format::kVersion, so an open native shard is that one.
  info.version = format::kVersion;
  info.aligned = (reader.flags() & format::kAligned) != 0;
  info.checksums = reader.has_checksums();
  return info;
}

nlohmann::ordered_json inspect_json(const Dataset& ds, const ShardFormatInfo* info,
                                    bool with_shards) {
  const Manifest& m = ds.manifest();
  nlohmann::ordered_json out = {{"path", ds.path()},    {"samples", m.samples},
                                {"bytes", m.bytes},     {"shard_count", ds.shard_count()},
                                {"aligned", m.aligned}, {"fields", m.fields},
                                {"classes", m.classes}};
  if (info != nullptr) {
    out["format"] = {{"kind", info->kind},
                     {"version", info->kind == "zerowait" ? nlohmann::ordered_json(info->version)
                                                          : nlohmann::ordered_json(nullptr)},
                     {"aligned", info->aligned},
                     {"checksums", info->checksums}};
  }
  if (with_shards) {
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    for (size_t s = 0; s < m.shards.size(); ++s) {
      shards.push_back({{"path", ds.shard_path(s)},
                        {"samples", m.shards[s].samples},
                        {"bytes", m.shards[s].bytes},
                        {"index_checksum", m.shards[s].checksum}});
    }
    out["shards"] = std::move(shards);
  }
  return out;
}

std::string yes_no(bool value) { return value ? "yes" : "no"; }

void print_inspect(const Dataset& ds, const ShardFormatInfo* info, bool with_shards) {
  const Manifest& m = ds.manifest();
  std::vector<std::pair<std::string, std::string>> lines = {
      {"dataset", ds.path()},
      {"samples", std::to_string(m.samples)},
      {"bytes", format_bytes(m.bytes) + " (" + std::to_string(m.bytes) + ")"},
      {"shards", std::to_string(ds.shard_count())},
      {"fields", m.fields.empty() ? "-" : join_limited(m.fields, m.fields.size())},
      {"classes", m.classes.empty() ? "-"
                                    : std::to_string(m.classes.size()) + " (" +
                                          join_limited(m.classes, kClassesShown) + ")"},
      {"aligned", yes_no(m.aligned)}};
  if (info != nullptr) {
    lines.push_back({"format", info->kind == "zerowait"
                                   ? "zerowait shard v" + std::to_string(info->version)
                                   : "WebDataset tar, read in place"});
    lines.push_back({"checksums", yes_no(info->checksums)});
  }
  print_key_values(std::cout, lines);
  if (!with_shards) return;
  std::cout << '\n';
  Table table({{"#", Align::kRight},
               {"samples", Align::kRight},
               {"bytes", Align::kRight},
               {"index xxh3"},
               {"path"}});
  for (size_t s = 0; s < m.shards.size(); ++s) {
    const ManifestShard& shard = m.shards[s];
    table.add_row({std::to_string(s), std::to_string(shard.samples), format_bytes(shard.bytes),
                   shard.checksum.empty() ? "-" : shard.checksum, ds.shard_path(s)});
  }
  table.print(std::cout);
}

int run_inspect(const InspectArgs& args) {
  std::shared_ptr<Dataset> ds = open_dataset(args.path);
  std::optional<ShardFormatInfo> info;
  if (ds->shard_count() == 1) info = shard_format_info(*unwrap(ds->shard(0)));
  const ShardFormatInfo* info_ptr = info ? &*info : nullptr;
  if (args.json) {
    print_json(inspect_json(*ds, info_ptr, args.shards));
  } else {
    print_inspect(*ds, info_ptr, args.shards);
  }
  return kExitOk;
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show what a dataset or shard holds");
  add_dataset_argument(cmd, "PATH", &args->path);
  add_json_flag(cmd, &args->json);
  cmd->add_flag("--shards", args->shards, "Also list every shard (samples, bytes, index checksum)");
  cmd->footer(
      "Examples:\n"
      "  zerowait inspect /fast/train\n"
      "  zerowait inspect /fast/train/shard-000000.zws --json");
  return {cmd, [args] { return run_inspect(*args); }};
}

}  // namespace zerowait::cli
