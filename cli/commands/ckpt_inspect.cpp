// `zerowait ckpt inspect DIR STEP`: what a committed step holds, rank by rank: its tensors, its
// files and the older steps it references.
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_manifest.hpp"
#include "commands/ckpt_common.hpp"
#include "output.hpp"
#include "zerowait/checkpoint/manifest.hpp"

namespace zerowait::cli {
namespace {

using json = nlohmann::ordered_json;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The step whose directory holds `path`; another step than the inspected one means an
// incremental save referenced it.
uint64_t owner_step(const std::string& path, uint64_t fallback) {
  return internal::step_of_path(path).value_or(fallback);
}

// The rank manifest as stored (docs/checkpoint-manifest.schema.json, the same encoder), plus
// for each tensor and file the step whose directory holds it.
json rank_json(const RankManifest& m) {
  json doc = json::parse(internal::encode_rank_manifest(m));
  for (json& entry : doc["tensors"]) {
    const uint64_t in_step = owner_step(entry["file"].get<std::string>(), m.step);
    entry["in_step"] = in_step;
    entry["referenced"] = in_step != m.step;
  }
  for (json& entry : doc["files"]) {
    const uint64_t in_step = owner_step(entry["path"].get<std::string>(), m.step);
    entry["in_step"] = in_step;
    entry["referenced"] = in_step != m.step;
  }
  return doc;
}

void print_rank(const RankManifest& m) {
  uint64_t bytes = 0;
  for (const StoredTensor& t : m.tensors) bytes += t.nbytes;
  std::cout << "rank " << m.rank << ": " << count_noun(m.tensors.size(), "tensor", "tensors")
            << ", " << format_bytes(bytes)
            << "; structure: " << format_bytes(m.structure_json.size())
            << " of JSON (shown by --json)\n";
  Table tensors({{"name"},
                 {"dtype"},
                 {"shape"},
                 {"bytes", Align::kRight},
                 {"stored", Align::kRight},
                 {"codec"},
                 {"file"}});
  for (const StoredTensor& t : m.tensors) {
    const uint64_t in_step = owner_step(t.file, m.step);
    tensors.add_row(
        {t.name, t.dtype, shape_text(t.shape), format_bytes(t.nbytes), format_bytes(t.stored_bytes),
         t.codec,
         in_step == m.step ? t.file : t.file + " (from step " + std::to_string(in_step) + ")"});
  }
  tensors.print(std::cout);
  std::cout << '\n';
  Table files({{"file"}, {"bytes", Align::kRight}, {"container"}, {"step", Align::kRight}});
  for (const StoredFile& f : m.files) {
    files.add_row(
        {f.path, format_bytes(f.bytes), f.container, std::to_string(owner_step(f.path, m.step))});
  }
  files.print(std::cout);
  std::cout << '\n';
}

}  // namespace

int run_inspect(const CkptArgs& args) {
  std::shared_ptr<Store> target = open_checkpoint_directory(args.dir);
  require_committed(*target, args.dir, args.step);
  const StepInfo info = unwrap(read_step_info(*target, args.step));
  std::vector<RankManifest> manifests;
  if (args.rank_option->count() > 0) {
    manifests.push_back(unwrap(read_rank_manifest(*target, args.step, args.rank)));
  } else {
    manifests = unwrap(read_rank_manifests(*target, args.step));
  }

  if (args.json) {
    json ranks = json::array();
    for (const RankManifest& m : manifests) ranks.push_back(rank_json(m));
    print_json({{"path", target->describe()},
                {"step", info.step},
                {"run_id", info.run_id},
                {"world_size", info.world_size},
                {"bytes_total", info.bytes_total},
                {"bytes_stored", info.bytes_stored},
                {"references", json(info.references)},
                {"created", info.created},
                {"ranks", std::move(ranks)}});
    return kExitOk;
  }

  std::cout << "step " << info.step << " in " << target->describe() << ", committed "
            << info.created << (info.run_id.empty() ? "" : " by run " + info.run_id) << "\n\n";
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  uint64_t referenced_bytes = 0;  // of tensors living in older steps' files
  uint64_t stored_bytes = 0;      // of the shown ranks' files in this step
  std::set<std::string> files;
  for (const RankManifest& m : manifests) {
    print_rank(m);
    tensors += m.tensors.size();
    for (const StoredTensor& t : m.tensors) {
      bytes += t.nbytes;
      if (owner_step(t.file, m.step) != m.step) referenced_bytes += t.nbytes;
    }
    for (const StoredFile& f : m.files) {
      if (files.insert(f.path).second && owner_step(f.path, m.step) == m.step) {
        stored_bytes += f.bytes;
      }
    }
  }
  std::cout << "step " << info.step << ": " << count_noun(manifests.size(), "rank", "ranks");
  if (manifests.size() != info.world_size) std::cout << " of " << info.world_size;
  std::cout << ", " << count_noun(tensors, "tensor", "tensors") << ", " << format_bytes(bytes)
            << " in " << count_noun(files.size(), "file", "files") << "; "
            << format_bytes(stored_bytes) << " stored in this step";
  if (referenced_bytes > 0) {
    std::cout << ", " << format_bytes(referenced_bytes) << " of tensors referenced from step "
              << references_text(info.references);
  }
  std::cout << '\n';
  return kExitOk;
}

}  // namespace zerowait::cli
