// The memory driver: "memory://NAME" is a Store held in this process's memory, shared by every
// open_store of the same NAME until the process ends. It has what an object store has and a
// local directory adds nothing to — no local path, no O_DIRECT — so tests prove that what runs
// on it needs nothing beyond the Store interface.
#include "storage/memory/memory_store.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "storage/store_path.hpp"

namespace zerowait {
namespace {

using Bytes = std::vector<std::byte>;

struct MemoryFiles {
  std::mutex mutex;
  std::set<std::string> directories{""};                // "" is the root
  std::map<std::string, std::shared_ptr<Bytes>> files;  // a writer keeps its file's bytes
};

class MemoryWritableFile : public WritableFile {
 public:
  MemoryWritableFile(std::shared_ptr<MemoryFiles> state, std::shared_ptr<Bytes> bytes,
                     std::string name)
      : state_(std::move(state)), bytes_(std::move(bytes)), name_(std::move(name)) {}

  // Memory never hangs: a deadline can only have passed before a call starts.
  Status write_at(uint64_t offset, std::span<const std::byte> bytes, Deadline deadline) override {
    ZW_RETURN_IF_ERROR(check(deadline, "writing"));
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (bytes_->size() < offset + bytes.size()) bytes_->resize(offset + bytes.size());
    if (!bytes.empty()) std::memcpy(bytes_->data() + offset, bytes.data(), bytes.size());
    return Status::ok();
  }
  void start_writeback(uint64_t, uint64_t, Deadline) override {}
  Status sync(Deadline deadline) override { return check(deadline, "syncing"); }
  Status close(Deadline deadline) override { return check(deadline, "closing"); }

 private:
  Status check(Deadline deadline, const char* what) const {
    if (!deadline.passed()) return Status::ok();
    return Status(ErrorCode::kDeadlineExceeded,
                  std::string(what) + " '" + name_ + "': its deadline had passed");
  }

  std::shared_ptr<MemoryFiles> state_;
  std::shared_ptr<Bytes> bytes_;
  std::string name_;  // the full name, for messages
};

// "a/b/c" -> "a/b"; "a" -> "".
std::string parent_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// Whether `path` is `dir` itself or inside it.
bool is_within(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(std::string name)
      : root_("memory://" + std::move(name)), state_(std::make_shared<MemoryFiles>()) {}

  std::string describe() const override { return root_; }

  Status make_directory(const std::string& path, Deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->files.count(path) != 0)
      return errno_status(EEXIST, "cannot create directory", full);
    for (std::string dir = path; !dir.empty(); dir = parent_of(dir)) {
      if (state_->files.count(dir) != 0)
        return errno_status(ENOTDIR, "cannot create directory", full);
      state_->directories.insert(dir);
    }
    return Status::ok();
  }

  Result<std::unique_ptr<WritableFile>> create(const std::string& path, Deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->directories.count(parent_of(path)) == 0) {
      return errno_status(ENOENT, "cannot create", full);
    }
    if (state_->directories.count(path) != 0) return errno_status(EISDIR, "cannot create", full);
    auto bytes = std::make_shared<Bytes>();
    state_->files[path] = bytes;
    return std::unique_ptr<WritableFile>(new MemoryWritableFile(state_, std::move(bytes), full));
  }

  Status sync_directory(const std::string& path, Deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->directories.count(path) == 0) {
      return errno_status(ENOENT, "cannot open directory", full);
    }
    return Status::ok();
  }

  Status publish(const std::string& from, const std::string& to, Deadline,
                 std::string_view) override {
    ZW_ASSIGN_OR_RETURN(std::string full_from, full_path(from));
    ZW_ASSIGN_OR_RETURN(std::string full_to, full_path(to));
    const std::string what = "cannot rename to '" + full_to + "' from";
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->directories.count(parent_of(to)) == 0) return errno_status(ENOENT, what, full_from);
    if (auto file = state_->files.find(from); file != state_->files.end()) {
      if (state_->directories.count(to) != 0) return errno_status(EISDIR, what, full_from);
      std::shared_ptr<Bytes> bytes = file->second;
      state_->files.erase(file);
      state_->files[to] = std::move(bytes);
      return Status::ok();
    }
    if (state_->directories.count(from) == 0 || from.empty()) {
      return errno_status(ENOENT, what, full_from);
    }
    // Publishing a directory never replaces anything (RENAME_NOREPLACE on a local directory).
    if (state_->directories.count(to) != 0 || state_->files.count(to) != 0) {
      return errno_status(EEXIST, what, full_from);
    }
    if (is_within(to, from)) return errno_status(EINVAL, what, full_from);
    const auto moved = [&](const std::string& path) { return to + path.substr(from.size()); };
    std::set<std::string> directories;
    for (const std::string& dir : state_->directories) {
      directories.insert(is_within(dir, from) ? moved(dir) : dir);
    }
    std::map<std::string, std::shared_ptr<Bytes>> files;
    for (auto& [path, bytes] : state_->files) {
      files[is_within(path, from) ? moved(path) : path] = std::move(bytes);
    }
    state_->directories = std::move(directories);
    state_->files = std::move(files);
    return Status::ok();
  }

  Result<std::vector<std::string>> list(const std::string& path, Deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->directories.count(path) == 0) {
      return errno_status(ENOENT, "cannot list directory", full);
    }
    std::set<std::string> names;
    const auto add_child = [&](const std::string& entry) {
      if (entry.empty() || parent_of(entry) != path) return;
      names.insert(path.empty() ? entry : entry.substr(path.size() + 1));
    };
    for (const std::string& dir : state_->directories) add_child(dir);
    for (const auto& file : state_->files) add_child(file.first);
    return std::vector<std::string>(names.begin(), names.end());
  }

  Result<ObjectStat> stat(const std::string& path, Deadline) override {
    ZW_RETURN_IF_ERROR(full_path(path).status());
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->directories.count(path) != 0) return ObjectStat{true, true, 0};
    auto file = state_->files.find(path);
    if (file == state_->files.end()) return ObjectStat{};
    return ObjectStat{true, false, static_cast<uint64_t>(file->second->size())};
  }

  Result<std::string> read(const std::string& path, Deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::lock_guard<std::mutex> lock(state_->mutex);
    ZW_ASSIGN_OR_RETURN(const Bytes* bytes, find_file(path, full, "cannot open"));
    return std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  }

  // A copy of the bytes: the source reads what the file held when it was opened.
  Result<std::unique_ptr<ByteSource>> open(const std::string& path, IoBackend, Deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::lock_guard<std::mutex> lock(state_->mutex);
    ZW_ASSIGN_OR_RETURN(const Bytes* bytes, find_file(path, full, "cannot open"));
    return make_memory_source(full, *bytes);
  }

  Status remove(const std::string& path, Deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->directories.count(path) != 0) return errno_status(EISDIR, "cannot remove", full);
    state_->files.erase(path);
    return Status::ok();
  }

  Status remove_all(const std::string& path, Deadline, std::string_view) override {
    if (path.empty()) return invalid_argument("refusing to remove the whole of " + describe());
    ZW_RETURN_IF_ERROR(full_path(path).status());
    std::lock_guard<std::mutex> lock(state_->mutex);
    std::erase_if(state_->directories, [&](const std::string& d) { return is_within(d, path); });
    std::erase_if(state_->files, [&](const auto& f) { return is_within(f.first, path); });
    return Status::ok();
  }

 private:
  Result<std::string> full_path(const std::string& path) const {
    return internal::join_store_path(root_, path);
  }

  // The bytes of file `path`; kNotFound / EISDIR otherwise. Call with the lock held.
  Result<const Bytes*> find_file(const std::string& path, const std::string& full,
                                 const char* what) const {
    auto file = state_->files.find(path);
    if (file != state_->files.end()) return static_cast<const Bytes*>(file->second.get());
    return errno_status(state_->directories.count(path) != 0 ? EISDIR : ENOENT, what, full);
  }

  std::string root_;
  std::shared_ptr<MemoryFiles> state_;
};

}  // namespace

namespace internal {
namespace {

constexpr std::string_view kPrefix = "memory://";

// "memory://NAME/PATH" -> NAME and PATH; kInvalidArgument without a NAME.
Result<std::pair<std::string, std::string>> split_memory_url(const std::string& url) {
  if (!url.starts_with(kPrefix) || url.size() == kPrefix.size() || url[kPrefix.size()] == '/') {
    return invalid_argument("'" + url + "' is not memory://NAME[/PATH]");
  }
  const std::string rest = url.substr(kPrefix.size());
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) return std::pair<std::string, std::string>{rest, ""};
  return std::pair<std::string, std::string>{rest.substr(0, slash), rest.substr(slash + 1)};
}

}  // namespace

Result<std::shared_ptr<Store>> open_memory_store(const std::string& url) {
  ZW_ASSIGN_OR_RETURN(auto parts, split_memory_url(url));
  if (!parts.second.empty()) {
    return invalid_argument("'" + url + "': a memory store is named memory://NAME, without a path");
  }
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<Store>> stores;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<Store>& store = stores[parts.first];
  if (!store) store = std::make_shared<MemoryStore>(parts.first);
  return store;
}

Result<std::unique_ptr<ByteSource>> open_memory_source(const std::string& url, IoBackend backend,
                                                       Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(auto parts, split_memory_url(url));
  ZW_ASSIGN_OR_RETURN(auto store, open_memory_store(std::string(kPrefix) + parts.first));
  return store->open(parts.second, backend, deadline);
}

}  // namespace internal

}  // namespace zerowait
