#include "host/system.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

extern char** environ;

namespace zerowait::host {
namespace {

namespace fs = std::filesystem;

std::string trim(std::string text) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  text.erase(text.begin(), std::find_if(text.begin(), text.end(), not_space));
  text.erase(std::find_if(text.rbegin(), text.rend(), not_space).base(), text.end());
  return text;
}

std::string errno_text(int error, const std::string& what) {
  const char* name = strerrorname_np(error);
  return std::string(name != nullptr ? name : "errno " + std::to_string(error)) + ": " + what +
         ": " + std::strerror(error);
}

// A fixture's facts file: one JSON object; a missing or malformed one gives no facts.
nlohmann::json parse_facts(const std::string& text) {
  if (text.empty()) return nlohmann::json::object();
  nlohmann::json facts = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return facts.is_object() ? facts : nlohmann::json::object();
}

std::optional<Limit> fixture_limit(const nlohmann::json& facts, const char* name) {
  const auto it = facts.find(name);
  if (it == facts.end() || !it->is_array() || it->size() != 2) return std::nullopt;
  const auto value = [](const nlohmann::json& v) {
    return v.is_number_unsigned() ? v.get<uint64_t>() : UINT64_MAX;  // "unlimited"
  };
  return Limit{value((*it)[0]), value((*it)[1])};
}

std::optional<ProbeResult> fixture_probe(const nlohmann::json& value) {
  if (value.is_boolean()) return ProbeResult{value.get<bool>(), ""};
  if (value.is_string()) return ProbeResult{false, value.get<std::string>()};
  return std::nullopt;
}

std::optional<Limit> live_limit(int resource) {
  rlimit limit{};
  if (getrlimit(resource, &limit) != 0) return std::nullopt;
  const auto value = [](rlim_t v) { return v == RLIM_INFINITY ? UINT64_MAX : uint64_t(v); };
  return Limit{value(limit.rlim_cur), value(limit.rlim_max)};
}

}  // namespace

System::System(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  if (!root_.empty()) {
    std::ifstream in(root_ + "/zerowait-facts.json");
    std::stringstream text;
    text << in.rdbuf();
    facts_ = text.str();
    const nlohmann::json facts = parse_facts(facts_);
    const auto it = facts.find("unreadable");
    if (it != facts.end() && it->is_array()) {
      for (const nlohmann::json& path : *it) {
        if (path.is_string()) unreadable_.push_back(path.get<std::string>());
      }
    }
  }
}

bool System::planted_denied(const std::string& path) const {
  return std::any_of(unreadable_.begin(), unreadable_.end(), [&](const std::string& entry) {
    return path.compare(0, entry.size(), entry) == 0 &&
           (path.size() == entry.size() || path[entry.size()] == '/');
  });
}

bool System::denied(const std::string& path) const {
  if (planted_denied(path)) return true;
  const auto refused = [](int error) { return error == EACCES || error == EPERM; };
  const int fd = ::open(host_path(path).c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return refused(errno);
  // Some files open and refuse the read instead (a few /proc and /sys files do).
  char byte = 0;
  const ssize_t got = ::read(fd, &byte, 1);
  const int error = errno;
  ::close(fd);
  return got < 0 && refused(error);
}

std::string System::host_path(const std::string& path) const { return root_ + path; }

std::optional<std::string> System::read(const std::string& path) const {
  if (planted_denied(path)) return std::nullopt;
  std::ifstream in(host_path(path), std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

std::optional<std::string> System::read_line(const std::string& path) const {
  std::optional<std::string> text = read(path);
  if (!text) return std::nullopt;
  const size_t end = text->find('\n');
  return trim(end == std::string::npos ? *text : text->substr(0, end));
}

std::optional<int64_t> System::read_int(const std::string& path) const {
  const std::optional<std::string> line = read_line(path);
  if (!line || line->empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(line->c_str(), &end, 10);
  if (errno != 0 || end == line->c_str()) return std::nullopt;
  return int64_t(value);
}

std::vector<std::string> System::list(const std::string& dir) const {
  std::vector<std::string> names;
  if (planted_denied(dir)) return names;
  std::error_code error;
  for (fs::directory_iterator it(host_path(dir), error), end; !error && it != end;
       it.increment(error)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool System::exists(const std::string& path) const {
  std::error_code error;
  return fs::exists(fs::symlink_status(host_path(path), error));
}

std::optional<std::string> System::link_target(const std::string& path) const {
  std::error_code error;
  const fs::path target = fs::read_symlink(host_path(path), error);
  if (error) return std::nullopt;
  return target.string();
}

std::optional<std::string> System::link_name(const std::string& path) const {
  const std::optional<std::string> target = link_target(path);
  if (!target) return std::nullopt;
  return fs::path(*target).filename().string();
}

std::string System::machine_path(const std::string& user_path) const {
  if (!live()) {
    // Inside a fixture root there is no current directory: "." and "" are its top.
    if (user_path.empty() || user_path == ".") return "/";
    return user_path[0] != '/' ? "/" + user_path : user_path;
  }
  char resolved[PATH_MAX];
  if (realpath(user_path.c_str(), resolved) != nullptr) return resolved;
  std::error_code error;
  const fs::path absolute = fs::absolute(user_path, error);
  return error ? user_path : absolute.lexically_normal().string();
}

std::optional<SpaceInfo> System::space(const std::string& path) const {
  if (!live()) {
    const nlohmann::json facts = parse_facts(facts_);
    const auto all = facts.find("space");
    if (all == facts.end() || !all->is_object() || !all->contains(path)) return std::nullopt;
    const nlohmann::json& s = (*all)[path];
    return SpaceInfo{s.value("bytes_total", uint64_t(0)), s.value("bytes_available", uint64_t(0)),
                     s.value("inodes_total", uint64_t(0)),
                     s.value("inodes_available", uint64_t(0))};
  }
  struct statvfs info {};
  if (statvfs(path.c_str(), &info) != 0) return std::nullopt;
  return SpaceInfo{uint64_t(info.f_blocks) * info.f_frsize, uint64_t(info.f_bavail) * info.f_frsize,
                   uint64_t(info.f_files), uint64_t(info.f_favail)};
}

std::optional<ProbeResult> System::o_direct(const std::string& path) const {
  if (!live()) {
    const nlohmann::json facts = parse_facts(facts_);
    const auto all = facts.find("o_direct");
    if (all == facts.end() || !all->is_object() || !all->contains(path)) return std::nullopt;
    return fixture_probe((*all)[path]);
  }
  // A directory is probed by creating an unnamed file in it (O_TMPFILE, nothing left behind);
  // a read-only directory falls back to opening one of its files for reading.
  std::error_code error;
  if (fs::is_directory(path, error)) {
    const int fd = ::open(path.c_str(), O_TMPFILE | O_RDWR | O_DIRECT, 0600);
    if (fd >= 0) {
      ::close(fd);
      return ProbeResult{true, "open(O_TMPFILE | O_DIRECT) in " + path};
    }
    if (errno != EROFS && errno != EACCES && errno != EOPNOTSUPP && errno != EISDIR) {
      return ProbeResult{false, errno_text(errno, "open(" + path + ", O_TMPFILE | O_DIRECT)")};
    }
    for (fs::directory_iterator it(path, error), end; !error && it != end; it.increment(error)) {
      if (it->is_regular_file(error)) return o_direct(it->path().string());
    }
    return std::nullopt;  // nothing to open: not known
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return ProbeResult{false, errno_text(errno, "open(" + path + ", O_DIRECT)")};
  ::close(fd);
  return ProbeResult{true, "open(" + path + ", O_RDONLY | O_DIRECT)"};
}

std::optional<ProbeResult> System::io_uring_setup() const {
  if (!live()) {
    const nlohmann::json facts = parse_facts(facts_);
    const auto it = facts.find("io_uring");
    return it == facts.end() ? std::nullopt : fixture_probe(*it);
  }
  io_uring ring{};
  const int result = io_uring_queue_init(4, &ring, 0);
  if (result < 0) return ProbeResult{false, errno_text(-result, "io_uring_setup(4 entries)")};
  io_uring_queue_exit(&ring);
  return ProbeResult{true, "io_uring_setup(4 entries) succeeded"};
}

std::optional<Limit> System::open_files_limit() const {
  if (!live()) return fixture_limit(parse_facts(facts_), "open_files");
  return live_limit(RLIMIT_NOFILE);
}

std::optional<Limit> System::locked_memory_limit() const {
  if (!live()) return fixture_limit(parse_facts(facts_), "locked_memory");
  return live_limit(RLIMIT_MEMLOCK);
}

std::optional<unsigned> System::usable_cpus() const {
  if (!live()) {
    const nlohmann::json facts = parse_facts(facts_);
    const auto it = facts.find("usable_cpus");
    if (it == facts.end() || !it->is_number_unsigned()) return std::nullopt;
    return it->get<unsigned>();
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return std::nullopt;
  return unsigned(CPU_COUNT(&set));
}

std::map<std::string, std::string> System::environment() const {
  std::map<std::string, std::string> env;
  if (!live()) {
    const nlohmann::json facts = parse_facts(facts_);
    const auto it = facts.find("env");
    if (it != facts.end() && it->is_object()) {
      for (const auto& [name, value] : it->items()) {
        if (value.is_string()) env[name] = value.get<std::string>();
      }
    }
    return env;
  }
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const size_t equals = text.find('=');
    if (equals != std::string::npos) env[text.substr(0, equals)] = text.substr(equals + 1);
  }
  return env;
}

}  // namespace zerowait::host
