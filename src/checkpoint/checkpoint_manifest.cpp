#include "checkpoint/checkpoint_manifest.hpp"

#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/file.hpp"
#include "common/json_number.hpp"

namespace zerowait::internal {
namespace {

using nlohmann::json;

Result<uint64_t> parse_hex64(const json& value, const std::string& what) {
  if (!value.is_string()) return corrupt(what + " is not a hex string");
  const std::string& s = value.get_ref<const std::string&>();
  uint64_t out = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    return corrupt(what + " '" + s + "' is not a 64-bit hex value");
  }
  return out;
}

// Runs `body` and turns a JSON type/field error into kCorrupt naming the file.
template <typename T, typename Body>
Result<T> decode_json(std::string_view text, const std::string& path, Body body) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return corrupt("'" + path + "' is not a JSON object (torn or damaged file)");
  }
  try {
    return body(doc);
  } catch (const json::exception& e) {
    return corrupt("'" + path + "': missing or malformed field: " + e.what());
  }
}

Status check_format(const json& doc, const char* expected, int newest, const std::string& path) {
  if (doc.value("format", "") != expected) {
    return corrupt("'" + path + "' is not a " + std::string(expected) + " document");
  }
  const int version = json_integer<int>(doc.at("version"));
  if (version > newest) {
    return unsupported("'" + path + "' has format version " + std::to_string(version) +
                       "; this zerowait reads up to " + std::to_string(newest) +
                       " (upgrade zerowait)");
  }
  return Status::ok();
}

}  // namespace

std::string hex64(uint64_t value) {
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016" PRIx64, value);
  return buffer;
}

std::string rank_manifest_name(uint32_t rank) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "rank-%05u.json", rank);
  return buffer;
}

std::string commit_record_path(uint64_t step) {
  return step_directory(step) + "/" + kCommitRecordName;
}

std::string data_file_name(uint32_t rank, uint32_t index, bool compressed) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "rank-%05u-%05u.%s", rank, index,
                compressed ? "zwc" : "safetensors");
  return buffer;
}

std::optional<uint64_t> parse_step_directory(std::string_view name, bool* tmp) {
  constexpr std::string_view kPrefix = "step-";
  constexpr std::string_view kTmp = kTempSuffix;
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  const bool is_tmp = name.ends_with(kTmp);
  if (is_tmp) name.remove_suffix(kTmp.size());
  if (name.empty() || (name.size() > 1 && name[0] == '0')) return std::nullopt;
  uint64_t step = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), step);
  if (ec != std::errc() || end != name.data() + name.size()) return std::nullopt;
  if (tmp != nullptr) *tmp = is_tmp;
  return step;
}

std::optional<uint64_t> step_of_path(std::string_view path) {
  const size_t slash = path.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  bool tmp = false;
  auto step = parse_step_directory(path.substr(0, slash), &tmp);
  if (!step || tmp) return std::nullopt;
  return step;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

std::string encode_commit_record(const CommitRecord& record) {
  json ranks = json::array();
  for (const RankEntry& r : record.ranks) {
    ranks.push_back(
        {{"rank", r.rank}, {"manifest", r.manifest}, {"bytes", r.bytes}, {"xxh3", hex64(r.xxh3)}});
  }
  const StepInfo& info = record.info;
  json doc = {{"format", "zerowait-checkpoint"},
              {"version", kCheckpointFormatVersion},
              {"step", info.step},
              {"run_id", info.run_id},
              {"world_size", info.world_size},
              {"created", info.created},
              {"bytes_total", info.bytes_total},
              {"bytes_stored", info.bytes_stored},
              {"references", info.references},
              {"ranks", ranks}};
  return doc.dump(1) + "\n";
}

Result<CommitRecord> decode_commit_record(std::string_view text, const std::string& path) {
  return decode_json<CommitRecord>(text, path, [&](const json& doc) -> Result<CommitRecord> {
    ZW_RETURN_IF_ERROR(check_format(doc, "zerowait-checkpoint", kCheckpointFormatVersion, path));
    CommitRecord record;
    StepInfo& info = record.info;
    info.step = json_integer<uint64_t>(doc.at("step"));
    info.run_id = doc.value("run_id", "");
    info.world_size = json_integer<uint32_t>(doc.at("world_size"));
    info.created = doc.value("created", "");
    info.bytes_total = json_integer<uint64_t>(doc.at("bytes_total"));
    info.bytes_stored = json_integer<uint64_t>(doc.at("bytes_stored"));
    info.references = json_integers<uint64_t>(doc.at("references"));
    for (const json& r : doc.at("ranks")) {
      RankEntry entry;
      entry.rank = json_integer<uint32_t>(r.at("rank"));
      entry.manifest = r.at("manifest").get<std::string>();
      entry.bytes = json_integer<uint64_t>(r.at("bytes"));
      ZW_ASSIGN_OR_RETURN(entry.xxh3, parse_hex64(r.at("xxh3"), path + ": ranks[].xxh3"));
      record.ranks.push_back(std::move(entry));
    }
    if (info.world_size == 0 || record.ranks.size() != info.world_size) {
      return corrupt("'" + path + "' lists " + std::to_string(record.ranks.size()) +
                     " ranks for world_size " + std::to_string(info.world_size));
    }
    for (uint32_t r = 0; r < info.world_size; ++r) {
      if (record.ranks[r].rank != r || record.ranks[r].manifest != rank_manifest_name(r)) {
        return corrupt("'" + path + "': ranks[" + std::to_string(r) + "] is not rank " +
                       std::to_string(r) + "'s manifest");
      }
    }
    return record;
  });
}

std::string encode_rank_manifest(const RankManifest& manifest) {
  json tensors = json::array();
  for (const StoredTensor& t : manifest.tensors) {
    json entry = {{"name", t.name},        {"dtype", t.dtype},
                  {"shape", t.shape},      {"nbytes", t.nbytes},
                  {"xxh3", hex64(t.xxh3)}, {"file", t.file},
                  {"offset", t.offset},    {"stored_bytes", t.stored_bytes},
                  {"codec", t.codec}};
    if (t.codec != "none") {
      entry["group_bytes"] = t.group_bytes;
      entry["chunk_bytes"] = t.chunk_bytes;
      entry["chunks"] = t.chunks;
    }
    tensors.push_back(std::move(entry));
  }
  json files = json::array();
  for (const StoredFile& f : manifest.files) {
    files.push_back({{"path", f.path},
                     {"bytes", f.bytes},
                     {"xxh3", hex64(f.xxh3)},
                     {"xxh3_of", f.checksum == FileChecksum::kSegments ? "segments" : "file"},
                     {"container", f.container}});
  }
  json structure = json::parse(manifest.structure_json, nullptr, false);
  if (structure.is_discarded()) structure = manifest.structure_json;  // kept verbatim
  json doc = {{"format", "zerowait-checkpoint-rank"},
              {"version", kRankManifestVersion},
              {"step", manifest.step},
              {"run_id", manifest.run_id},
              {"rank", manifest.rank},
              {"world_size", manifest.world_size},
              {"files", files},
              {"tensors", tensors},
              {"structure", structure}};
  // Only parts of ranks meeting through files carry one: other manifests stay as they were.
  if (!manifest.coordinator.empty()) doc["coordinator"] = manifest.coordinator;
  return doc.dump(1) + "\n";
}

Result<RankManifest> decode_rank_manifest(std::string_view text, const std::string& path) {
  return decode_json<RankManifest>(text, path, [&](const json& doc) -> Result<RankManifest> {
    ZW_RETURN_IF_ERROR(check_format(doc, "zerowait-checkpoint-rank", kRankManifestVersion, path));
    RankManifest m;
    m.step = json_integer<uint64_t>(doc.at("step"));
    m.run_id = doc.value("run_id", "");
    m.rank = json_integer<uint32_t>(doc.at("rank"));
    m.world_size = json_integer<uint32_t>(doc.at("world_size"));
    m.coordinator = doc.value("coordinator", "");
    m.structure_json = doc.at("structure").dump();
    for (const json& f : doc.at("files")) {
      StoredFile file;
      file.path = f.at("path").get<std::string>();
      file.bytes = json_integer<uint64_t>(f.at("bytes"));
      ZW_ASSIGN_OR_RETURN(file.xxh3, parse_hex64(f.at("xxh3"), path + ": files[].xxh3"));
      file.container = f.at("container").get<std::string>();
      // Version 1 manifests have no "xxh3_of": their checksums are of whole files.
      const std::string xxh3_of = f.value("xxh3_of", "file");
      if (xxh3_of == "segments" && file.container == "safetensors") {
        file.checksum = FileChecksum::kSegments;
      } else if (xxh3_of != "file") {
        return corrupt("'" + path + "': file '" + file.path + "' has xxh3_of \"" + xxh3_of +
                       "\" (expected \"file\", or \"segments\" for a safetensors file)");
      }
      if (!step_of_path(file.path) || file.path.find("..") != std::string::npos) {
        return corrupt("'" + path + "': file path '" + file.path + "' is not inside a step");
      }
      m.files.push_back(std::move(file));
    }
    for (const json& t : doc.at("tensors")) {
      StoredTensor tensor;
      tensor.name = t.at("name").get<std::string>();
      tensor.dtype = t.at("dtype").get<std::string>();
      tensor.shape = json_integers<int64_t>(t.at("shape"));
      tensor.nbytes = json_integer<uint64_t>(t.at("nbytes"));
      ZW_ASSIGN_OR_RETURN(tensor.xxh3,
                          parse_hex64(t.at("xxh3"), path + ": tensor '" + tensor.name + "' xxh3"));
      tensor.file = t.at("file").get<std::string>();
      tensor.offset = json_integer<uint64_t>(t.at("offset"));
      tensor.stored_bytes = json_integer<uint64_t>(t.at("stored_bytes"));
      tensor.codec = t.at("codec").get<std::string>();
      if (tensor.codec == "zstd") {
        tensor.group_bytes = json_integer<uint32_t>(t.at("group_bytes"));
        tensor.chunk_bytes = json_integer<uint64_t>(t.at("chunk_bytes"));
        tensor.chunks = json_integers<uint64_t>(t.at("chunks"));
      } else if (tensor.codec != "none") {
        return unsupported("'" + path + "': tensor '" + tensor.name + "' uses codec '" +
                           tensor.codec + "', unknown to this zerowait");
      }
      bool listed = false;
      for (const StoredFile& f : m.files) listed = listed || f.path == tensor.file;
      if (!listed) {
        return corrupt("'" + path + "': tensor '" + tensor.name + "' lives in '" + tensor.file +
                       "', which the manifest's file list does not have");
      }
      m.tensors.push_back(std::move(tensor));
    }
    return m;
  });
}

}  // namespace zerowait::internal
