// `export_safetensors`: one committed step as one safetensors file of full tensors. Per-rank
// tensors are read straight from the chosen rank's files; sharded tensors are assembled from
// their chunks' pieces (docs/checkpoint.md, "Sharded state"), read where the `sharded` section
// of the rank manifests says they live. Every byte goes through read_tensors, so every tensor
// and piece is checked against its xxh3 before it is written.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "checkpoint/dtype_cast.hpp"
#include "checkpoint/safetensors.hpp"
#include "common/file.hpp"
#include "zerowait/checkpoint/export.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/storage/url.hpp"

namespace zerowait {
namespace {

using json = nlohmann::json;

// Per-rank tensors read by one read_tensors call: big enough to keep every read thread busy,
// small enough to stream.
constexpr uint64_t kPlainBatchBytes = 256ull << 20;

// Memory for one batch of tensors, grown as needed and never zero-filled (every byte is read).
class Scratch {
 public:
  std::byte* reserve(uint64_t bytes) {
    if (bytes > capacity_) {
      data_.reset(new std::byte[bytes]);
      capacity_ = bytes;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  uint64_t capacity_ = 0;
};

// torch dtype names (the `sharded` section's "dtype") -> safetensors names.
const std::map<std::string, std::string>& torch_to_safetensors() {
  static const std::map<std::string, std::string> names = {
      {"bool", "BOOL"},     {"uint8", "U8"},          {"int8", "I8"},
      {"float8_e5m2", "F8_E5M2"}, {"float8_e4m3fn", "F8_E4M3"}, {"float8_e8m0fnu", "F8_E8M0"},
      {"int16", "I16"},     {"uint16", "U16"},        {"float16", "F16"},
      {"bfloat16", "BF16"}, {"int32", "I32"},         {"uint32", "U32"},
      {"float32", "F32"},   {"int64", "I64"},         {"uint64", "U64"},
      {"float64", "F64"},   {"complex64", "C64"}};
  return names;
}

const char* dtype_name(ExportDtype dtype) {
  switch (dtype) {
    case ExportDtype::kBFloat16: return "BF16";
    case ExportDtype::kFloat16: return "F16";
    case ExportDtype::kFloat32: return "F32";
    case ExportDtype::kAsSaved: break;
  }
  return "";
}

// One saved chunk of a sharded tensor: a box of the full tensor, stored as pieces of
// `piece_bytes` (the last shorter) in rank `rank`'s part.
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  uint32_t rank = 0;
  uint64_t nbytes = 0;
  uint64_t piece_bytes = 0;
  std::vector<std::string> pieces;
};

// One tensor of the export: a per-rank tensor (index into the rank's manifest) or a sharded one.
struct Item {
  std::string name;
  std::string saved_dtype;  // safetensors
  std::string dtype;        // written
  std::vector<int64_t> shape;
  uint64_t saved_bytes = 0;
  uint64_t bytes = 0;
  std::optional<size_t> index;  // per-rank
  std::vector<Chunk> chunks;    // sharded
  uint64_t begin = 0;           // in the data area
};

uint64_t element_count(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), uint64_t{1},
                         [](uint64_t a, int64_t d) { return a * static_cast<uint64_t>(d); });
}

// Pieces are tensors named "<key>~chunk<j>~piece<k>": "~" followed by a letter never occurs in
// a JSON pointer, so no key path looks like one.
bool is_piece_name(const std::string& name) { return name.find("~chunk") != std::string::npos; }

// The global entries of every sharded tensor, from the `sharded` sections of the rank
// manifests (the lowest rank of each tensor's mesh records it; the first record wins).
Result<std::map<std::string, json>> sharded_entries(const std::vector<RankManifest>& manifests) {
  std::map<std::string, json> entries;
  for (const RankManifest& m : manifests) {
    if (m.structure_json.empty()) continue;
    json structure = json::parse(m.structure_json, nullptr, false);
    if (structure.is_discarded() || !structure.is_object()) {
      return corrupt("rank " + std::to_string(m.rank) + "'s manifest of step " +
                     std::to_string(m.step) + ": its structure is not JSON");
    }
    auto section = structure.find("sharded");
    if (section == structure.end() || !section->is_object()) continue;
    auto tensors = section->find("tensors");
    if (tensors == section->end() || !tensors->is_object()) continue;
    for (auto& [key, entry] : tensors->items()) entries.emplace(key, entry);
  }
  return entries;
}

Result<Item> sharded_item(const std::string& key, const json& entry, uint32_t world_size,
                          const std::string& where) {
  Item item;
  const auto fail = [&](const std::string& why) {
    return corrupt(where + ": the sharded entry of " + key + " " + why);
  };
  try {
    const std::string torch_dtype = entry.at("dtype").get<std::string>();
    auto name = torch_to_safetensors().find(torch_dtype);
    if (name == torch_to_safetensors().end()) {
      return invalid_argument(where + ": sharded tensor " + key + " has dtype " + torch_dtype +
                              ", which safetensors has no name for");
    }
    item.saved_dtype = name->second;
    item.shape = entry.at("shape").get<std::vector<int64_t>>();
    const uint32_t element = internal::safetensors::dtype_size(item.saved_dtype);
    item.saved_bytes = element_count(item.shape) * element;
    uint64_t covered = 0;
    for (const json& c : entry.at("chunks")) {
      Chunk chunk{c.at("offsets").get<std::vector<int64_t>>(),
                  c.at("sizes").get<std::vector<int64_t>>(),
                  c.at("rank").get<uint32_t>(),
                  c.at("nbytes").get<uint64_t>(),
                  c.at("piece_bytes").get<uint64_t>(),
                  c.at("pieces").get<std::vector<std::string>>()};
      if (chunk.offsets.size() != item.shape.size() || chunk.sizes.size() != item.shape.size()) {
        return fail("has a chunk of another rank (number of dimensions)");
      }
      for (size_t d = 0; d < item.shape.size(); ++d) {
        if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 ||
            chunk.offsets[d] + chunk.sizes[d] > item.shape[d]) {
          return fail("has a chunk outside the tensor");
        }
      }
      if (chunk.nbytes != element_count(chunk.sizes) * element || chunk.piece_bytes == 0 ||
          chunk.pieces.size() != (chunk.nbytes + chunk.piece_bytes - 1) / chunk.piece_bytes) {
        return fail("has a chunk whose size or pieces do not add up");
      }
      if (chunk.rank >= world_size) {
        return fail("names rank " + std::to_string(chunk.rank) + ", but the step has " +
                    std::to_string(world_size) + " ranks");
      }
      covered += chunk.nbytes;
      item.chunks.push_back(std::move(chunk));
    }
    // Distinct chunks tile the tensor: anything else would leave bytes unwritten.
    if (covered != item.saved_bytes) return fail("has chunks that do not cover the tensor");
  } catch (const json::exception& e) {
    return fail(std::string("is malformed: ") + e.what());
  }
  item.name = key;
  return item;
}

// The runs of consecutive bytes a chunk's box makes in the full tensor, in chunk order:
// (offset in the full tensor, bytes). One run means the pieces can be read straight into place.
std::vector<std::pair<uint64_t, uint64_t>> chunk_runs(const Chunk& c,
                                                      const std::vector<int64_t>& shape,
                                                      uint64_t element) {
  const size_t n = shape.size();
  if (n == 0) return {{0, c.nbytes}};
  std::vector<uint64_t> stride(n, element);  // bytes per step of each dimension
  for (size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  // Dimensions k+1.. are covered whole: one run spans sizes[k] along k.
  size_t k = n - 1;
  while (k > 0 && c.sizes[k] == shape[k]) --k;
  const uint64_t run = c.sizes[k] * stride[k];
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  std::vector<int64_t> at(k, 0);  // position in the outer dimensions 0..k-1
  while (true) {
    uint64_t offset = c.offsets[k] * stride[k];
    for (size_t d = 0; d < k; ++d) offset += (c.offsets[d] + at[d]) * stride[d];
    if (!runs.empty() && runs.back().first + runs.back().second == offset) {
      runs.back().second += run;  // outer dimensions of size 1 continue the run
    } else {
      runs.emplace_back(offset, run);
    }
    size_t d = k;
    while (d > 0 && ++at[d - 1] == c.sizes[d - 1]) at[--d] = 0;
    if (d == 0) break;
  }
  return runs;
}

class Exporter {
 public:
  Exporter(Store& target, std::vector<RankManifest> manifests, const ExportOptions& options)
      : target_(target), manifests_(std::move(manifests)), options_(options) {}

  Status plan(const std::map<std::string, json>& entries);
  Status write(const std::string& path, ExportReport* report);

 private:
  RestoreOptions read_options() const {
    return RestoreOptions{options_.threads, true, true, options_.read_timeout};
  }
  // The bytes of the per-rank items [first, last) read into `buffer` back to back.
  Status read_plain(size_t first, size_t last, std::byte* buffer);
  Status read_sharded(const Item& item, std::byte* dst);
  Result<size_t> piece_index(uint32_t rank, const std::string& name);
  std::string where() const {
    return "step " + std::to_string(manifests_[0].step) + " in " + target_.describe();
  }

  Store& target_;
  std::vector<RankManifest> manifests_;
  const ExportOptions& options_;
  std::vector<Item> items_;
  std::map<uint32_t, std::map<std::string, size_t>> piece_indexes_;
};

Status Exporter::plan(const std::map<std::string, json>& entries) {
  const RankManifest& mine = manifests_[options_.rank];
  for (size_t i = 0; i < mine.tensors.size(); ++i) {
    const StoredTensor& t = mine.tensors[i];
    if (is_piece_name(t.name)) continue;
    Item item;
    item.name = t.name;
    item.saved_dtype = t.dtype;
    item.shape = t.shape;
    item.saved_bytes = t.nbytes;
    item.index = i;
    items_.push_back(std::move(item));
  }
  for (const auto& [key, entry] : entries) {
    ZW_ASSIGN_OR_RETURN(Item item, sharded_item(key, entry, manifests_.size(), where()));
    items_.push_back(std::move(item));
  }
  // The prefix, then the names the file holds.
  std::vector<Item> kept;
  for (Item& item : items_) {
    if (item.name.compare(0, options_.prefix.size(), options_.prefix) != 0) continue;
    item.name.erase(0, options_.prefix.size());
    if (item.name.empty()) item.name = "/";
    kept.push_back(std::move(item));
  }
  if (kept.empty()) {
    return invalid_argument(where() + " holds no tensor" +
                            (options_.prefix.empty() ? std::string()
                                                     : " whose key path starts with '" +
                                                           options_.prefix + "'"));
  }
  items_ = std::move(kept);
  std::sort(items_.begin(), items_.end(),
            [](const Item& a, const Item& b) { return a.name < b.name; });
  for (size_t i = 1; i < items_.size(); ++i) {
    if (items_[i].name == items_[i - 1].name) {
      return invalid_argument(where() + ": two tensors would be named '" + items_[i].name + "'");
    }
  }
  uint64_t offset = 0;
  for (Item& item : items_) {
    const bool cast =
        options_.dtype != ExportDtype::kAsSaved && internal::is_castable_float(item.saved_dtype);
    item.dtype = cast ? dtype_name(options_.dtype) : item.saved_dtype;
    item.bytes = item.saved_bytes / internal::safetensors::dtype_size(item.saved_dtype) *
                 internal::safetensors::dtype_size(item.dtype);
    item.begin = offset;
    offset += item.bytes;
  }
  return Status::ok();
}

Status Exporter::read_plain(size_t first, size_t last, std::byte* buffer) {
  std::vector<TensorRead> reads;
  uint64_t at = 0;
  for (size_t i = first; i < last; ++i) {
    reads.push_back({*items_[i].index, buffer + at, false});
    at += items_[i].saved_bytes;
  }
  return read_tensors(target_, manifests_[options_.rank], reads, read_options());
}

Result<size_t> Exporter::piece_index(uint32_t rank, const std::string& name) {
  auto [it, inserted] = piece_indexes_.try_emplace(rank);
  if (inserted) {
    const std::vector<StoredTensor>& tensors = manifests_[rank].tensors;
    for (size_t i = 0; i < tensors.size(); ++i) it->second.emplace(tensors[i].name, i);
  }
  auto found = it->second.find(name);
  if (found == it->second.end()) {
    return corrupt(where() + ": rank " + std::to_string(rank) + "'s manifest lacks piece " +
                   name);
  }
  return found->second;
}

Status Exporter::read_sharded(const Item& item, std::byte* dst) {
  const uint64_t element = internal::safetensors::dtype_size(item.saved_dtype);
  Scratch scratch;
  for (const Chunk& chunk : item.chunks) {
    if (chunk.nbytes == 0) continue;
    const auto runs = chunk_runs(chunk, item.shape, element);
    // One run: the pieces land in place; else in a chunk buffer, then scattered run by run.
    std::byte* base = dst + runs[0].first;
    if (runs.size() > 1) base = scratch.reserve(chunk.nbytes);
    const RankManifest& manifest = manifests_[chunk.rank];
    std::vector<TensorRead> reads;
    for (size_t k = 0; k < chunk.pieces.size(); ++k) {
      ZW_ASSIGN_OR_RETURN(size_t index, piece_index(chunk.rank, chunk.pieces[k]));
      const uint64_t expected = std::min(chunk.piece_bytes, chunk.nbytes - k * chunk.piece_bytes);
      if (manifest.tensors[index].nbytes != expected) {
        return corrupt(where() + ": piece " + chunk.pieces[k] + " holds " +
                       std::to_string(manifest.tensors[index].nbytes) + " bytes, its chunk says " +
                       std::to_string(expected));
      }
      reads.push_back({index, base + k * chunk.piece_bytes, false});
    }
    Status read = read_tensors(target_, manifest, reads, read_options());
    if (!read.is_ok()) {
      return read.with_context("sharded tensor " + item.name + ", saved by rank " +
                               std::to_string(chunk.rank));
    }
    if (runs.size() > 1) {
      uint64_t from = 0;
      for (const auto& [offset, bytes] : runs) {
        std::memcpy(dst + offset, base + from, bytes);
        from += bytes;
      }
    }
  }
  return Status::ok();
}

Status Exporter::write(const std::string& path, ExportReport* report) {
  std::vector<internal::safetensors::TensorEntry> entries;
  for (const Item& item : items_) {
    entries.push_back({item.name, item.dtype, item.shape, item.begin, item.begin + item.bytes});
  }
  const RankManifest& first = manifests_[0];
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", std::to_string(first.step)}, {"run_id", first.run_id}};
  ZW_ASSIGN_OR_RETURN(std::string header, internal::safetensors::encode_header(entries, metadata));
  const uint64_t total = items_.empty() ? 0 : items_.back().begin + items_.back().bytes;

  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + internal::kTempSuffix + "." + std::to_string(::getpid()) + "." +
                          std::to_string(counter++);
  ZW_ASSIGN_OR_RETURN(internal::File file, internal::File::create(tmp));
  Status status = [&]() -> Status {
    ZW_RETURN_IF_ERROR(file.pwrite_all(0, std::as_bytes(std::span(header))));
    const uint64_t data_start = header.size();
    Scratch saved, cast;
    uint64_t written = 0;
    for (size_t i = 0; i < items_.size();) {
      // A run of per-rank items read together, or one sharded item.
      size_t last = i + 1;
      if (items_[i].index) {
        uint64_t bytes = items_[i].saved_bytes;
        while (last < items_.size() && items_[last].index &&
               bytes + items_[last].saved_bytes <= kPlainBatchBytes) {
          bytes += items_[last++].saved_bytes;
        }
        ZW_RETURN_IF_ERROR(read_plain(i, last, saved.reserve(bytes)));
      } else {
        ZW_RETURN_IF_ERROR(read_sharded(items_[i], saved.reserve(items_[i].saved_bytes)));
      }
      const std::byte* batch = saved.reserve(0);
      uint64_t at = 0;
      for (; i < last; ++i) {
        const Item& item = items_[i];
        std::span<const std::byte> bytes(batch + at, item.saved_bytes);
        at += item.saved_bytes;
        report->bytes_read += item.saved_bytes;
        if (item.dtype != item.saved_dtype) {
          std::span<std::byte> out(cast.reserve(item.bytes), item.bytes);
          internal::cast_floats(item.saved_dtype, bytes, item.dtype, out,
                                item.saved_bytes /
                                    internal::safetensors::dtype_size(item.saved_dtype));
          bytes = out;
        }
        ZW_RETURN_IF_ERROR(file.pwrite_all(data_start + item.begin, bytes));
        written += item.bytes;
        if (options_.progress) options_.progress(written, total);
      }
    }
    ZW_RETURN_IF_ERROR(file.sync());
    ZW_RETURN_IF_ERROR(file.close());
    ZW_RETURN_IF_ERROR(internal::rename_file(tmp, path));
    const size_t slash = path.rfind('/');
    return internal::sync_directory(slash == std::string::npos ? "." : path.substr(0, slash + 1));
  }();
  if (!status.is_ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  report->file_bytes = header.size() + total;
  for (const Item& item : items_) {
    report->tensors.push_back({item.name, item.dtype, item.saved_dtype, item.shape, item.bytes,
                               static_cast<uint32_t>(item.chunks.size())});
  }
  return Status::ok();
}

}  // namespace

Result<ExportReport> export_safetensors(Store& target, uint64_t step, const std::string& path,
                                        const ExportOptions& options) {
  if (is_url(path)) {
    return invalid_argument("'" + path + "': an export is written to a local file, not a URL");
  }
  ZW_ASSIGN_OR_RETURN(StepInfo info, read_step_info(target, step));
  if (options.rank >= info.world_size) {
    return invalid_argument("step " + std::to_string(step) + " was saved by world_size " +
                            std::to_string(info.world_size) + "; there is no rank " +
                            std::to_string(options.rank));
  }
  ZW_ASSIGN_OR_RETURN(std::vector<RankManifest> manifests, read_rank_manifests(target, step));
  ZW_ASSIGN_OR_RETURN(auto entries, sharded_entries(manifests));
  ExportReport report;
  report.step = step;
  report.run_id = info.run_id;
  report.world_size = info.world_size;
  Exporter exporter(target, std::move(manifests), options);
  ZW_RETURN_IF_ERROR(exporter.plan(entries));
  ZW_RETURN_IF_ERROR(exporter.write(path, &report));
  return report;
}

}  // namespace zerowait
