#include "observe/run/run_directory.hpp"

#include <filesystem>
#include <system_error>

#include "common/file.hpp"
#include "observe/run/run_json.hpp"
#include "zerowait/observe/causes.hpp"

namespace zerowait::observe {
namespace {

constexpr const char* kKinds[] = {"profile", "watch", "emulate"};

size_t cause_index(std::string_view cause) {
  for (size_t i = 0; i < kCauses.size(); ++i) {
    if (cause == kCauses[i]) return i;
  }
  return kCauses.size();
}

std::string known_causes() {
  std::string text;
  for (const char* cause : kCauses) text += (text.empty() ? "" : ", ") + std::string(cause);
  return text;
}

}  // namespace

std::string json_lines(const std::vector<nlohmann::ordered_json>& objects) {
  std::string text;
  for (const nlohmann::ordered_json& object : objects) text += object.dump() + "\n";
  return text;
}

Status check_run(const nlohmann::ordered_json& run) {
  if (!run.is_object()) return invalid_argument("run.json must be a JSON object");
  const auto schema = run.find("schema");
  if (schema == run.end() || *schema != kRunSchema) {
    return invalid_argument(std::string("run.json's schema must be \"") + kRunSchema + "\", not " +
                            (schema == run.end() ? "missing" : schema->dump()));
  }
  const auto kind = run.find("kind");
  bool known_kind = false;
  for (const char* k : kKinds) known_kind = known_kind || (kind != run.end() && *kind == k);
  if (!known_kind) {
    return invalid_argument("run.json's kind must be profile, watch or emulate, not " +
                            (kind == run.end() ? std::string("missing") : kind->dump()));
  }
  const auto causes = run.find("causes");
  if (causes == run.end() || !causes->is_array()) {
    return invalid_argument("run.json's causes must be a list of causes");
  }
  size_t previous = 0;
  for (size_t i = 0; i < causes->size(); ++i) {
    const nlohmann::ordered_json& cause = (*causes)[i];
    const size_t index = cause.is_string() ? cause_index(cause.get<std::string>()) : kCauses.size();
    if (index == kCauses.size()) {
      return invalid_argument("run.json's causes[" + std::to_string(i) + "] is " + cause.dump() +
                              ": not one of " + known_causes());
    }
    if (i > 0 && index <= previous) {
      return invalid_argument("run.json's causes must follow the order " + known_causes() +
                              " (and name each once): " + causes->dump());
    }
    previous = index;
  }
  return Status::ok();
}

Status write_run_directory(const std::string& dir, const nlohmann::ordered_json& run,
                           const std::vector<RunFile>& files) {
  ZW_RETURN_IF_ERROR(check_run(run));
  for (const RunFile& file : files) {
    const std::filesystem::path name(file.name);
    bool climbs = name.empty() || name.is_absolute();
    for (const auto& part : name) climbs = climbs || part == "..";
    if (climbs) {
      return invalid_argument("'" + file.name + "' is not a file name inside the run directory");
    }
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return errno_status(error.value(), "cannot create the run directory", dir);
  for (const RunFile& file : files) {
    const std::filesystem::path path = std::filesystem::path(dir) / file.name;
    std::filesystem::create_directories(path.parent_path(), error);
    if (error) return errno_status(error.value(), "cannot create", path.parent_path().string());
    ZW_RETURN_IF_ERROR(internal::write_file_atomic(path.string(), file.lines));
  }
  // run.json last: a directory with run.json is a complete run.
  return internal::write_file_atomic(dir + "/run.json", run.dump(2) + "\n");
}

}  // namespace zerowait::observe
