#include "zerowait/shard/manifest.hpp"

#include <nlohmann/json.hpp>

#include "common/file.hpp"
#include "common/json_number.hpp"

namespace zerowait {
namespace {

// Ordered: a manifest keeps its keys in the order written.
using nlohmann::ordered_json;

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string Manifest::to_json() const {
  ordered_json j;
  j["format"] = kFormatName;
  j["version"] = version;
  j["samples"] = samples;
  j["bytes"] = bytes;
  j["aligned"] = aligned;
  j["fields"] = fields;
  j["classes"] = classes;
  if (part) j["part"] = {{"index", part->index}, {"count", part->count}, {"input", part->input}};
  ordered_json shard_list = ordered_json::array();
  for (const ManifestShard& s : shards) {
    shard_list.push_back(
        {{"path", s.path}, {"samples", s.samples}, {"bytes", s.bytes}, {"index_xxh3", s.checksum}});
  }
  j["shards"] = std::move(shard_list);
  return j.dump(1) + "\n";
}

Result<Manifest> Manifest::parse(const std::string& json_text, const std::string& name) {
  ordered_json j = ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return corrupt("manifest '" + name + "' is not valid JSON");
  }
  Manifest m;
  try {
    if (j.value("format", std::string()) != kFormatName) {
      return corrupt("'" + name + "' is not a zerowait manifest (field \"format\" is not \"" +
                     std::string(kFormatName) + "\")");
    }
    m.version = internal::json_integer<uint32_t>(j.at("version"));
    if (m.version != 1) {
      return unsupported("manifest '" + name + "' has version " + std::to_string(m.version) +
                         "; this build reads version 1: upgrade zerowait");
    }
    m.samples = internal::json_integer<uint64_t>(j.at("samples"));
    m.bytes = internal::json_integer<uint64_t>(j.at("bytes"));
    m.aligned = j.value("aligned", false);
    m.fields = j.value("fields", std::vector<std::string>{});
    m.classes = j.value("classes", std::vector<std::string>{});
    if (j.contains("part")) {
      const ordered_json& p = j.at("part");
      ManifestPart part{internal::json_integer<uint32_t>(p.at("index")),
                        internal::json_integer<uint32_t>(p.at("count")),
                        p.at("input").get<std::string>()};
      if (part.count < 2 || part.index >= part.count || !is_hex16(part.input)) {
        return corrupt("manifest '" + name + "': \"part\" must hold an index below a count of 2 " +
                       "or more and a 16-hex-digit input fingerprint");
      }
      m.part = std::move(part);
    }
    uint64_t total_samples = 0, total_bytes = 0;
    for (const ordered_json& s : j.at("shards")) {
      ManifestShard shard;
      shard.path = s.at("path").get<std::string>();
      shard.samples = internal::json_integer<uint64_t>(s.at("samples"));
      shard.bytes = internal::json_integer<uint64_t>(s.at("bytes"));
      shard.checksum = s.value("index_xxh3", std::string());
      if (shard.path.empty() || shard.path.front() == '/' ||
          shard.path.find("..") != std::string::npos) {
        return corrupt("manifest '" + name + "': shard path \"" + shard.path +
                       "\" must be relative, inside the dataset directory");
      }
      if (!shard.checksum.empty() && !is_hex16(shard.checksum)) {
        return corrupt("manifest '" + name + "': shard \"" + shard.path +
                       "\" has a malformed index_xxh3 \"" + shard.checksum + "\"");
      }
      total_samples += shard.samples;
      total_bytes += shard.bytes;
      m.shards.push_back(std::move(shard));
    }
    if (total_samples != m.samples || total_bytes != m.bytes) {
      return corrupt("manifest '" + name + "': shard samples/bytes add up to " +
                     std::to_string(total_samples) + "/" + std::to_string(total_bytes) +
                     ", the totals say " + std::to_string(m.samples) + "/" +
                     std::to_string(m.bytes));
    }
  } catch (const ordered_json::exception& e) {
    return corrupt("manifest '" + name + "': " + e.what());
  }
  return m;
}

Result<Manifest> Manifest::load(const std::string& path) {
  ZW_ASSIGN_OR_RETURN(std::string text, internal::read_whole_file(path));
  return parse(text, path);
}

Status Manifest::save(const std::string& path, bool sync) const {
  return internal::write_file_atomic(path, to_json(), sync);
}

}  // namespace zerowait
