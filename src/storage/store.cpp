#include "zerowait/storage/store.hpp"

#include <algorithm>
#include <cerrno>

#include "storage/store_path.hpp"

namespace zerowait {

namespace internal {

Result<std::string> join_store_path(const std::string& root, const std::string& path) {
  bool valid = path.empty() || path.front() != '/';
  for (size_t start = 0; valid && start <= path.size();) {
    size_t end = std::min(path.find('/', start), path.size());
    valid = path.compare(start, end - start, "..") != 0;
    start = end + 1;
  }
  if (!valid) {
    return invalid_argument("invalid path '" + path + "' in " + root +
                            ": it must be relative, without '..'");
  }
  if (path.empty()) return root;
  return root.ends_with('/') ? root + path : root + "/" + path;
}

}  // namespace internal

Result<bool> Store::exists(const std::string& path, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(ObjectStat st, stat(path, deadline));
  return st.exists;
}

Result<bool> Store::is_directory(const std::string& path, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(ObjectStat st, stat(path, deadline));
  return st.exists && st.is_directory;
}

Result<uint64_t> Store::size(const std::string& path, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(ObjectStat st, stat(path, deadline));
  ZW_ASSIGN_OR_RETURN(std::string full, internal::join_store_path(describe(), path));
  if (!st.exists) return errno_status(ENOENT, "cannot stat", full);
  if (st.is_directory) return errno_status(EISDIR, "cannot take the file size of", full);
  return st.size;
}

Status Store::put(const std::string& path, std::span<const std::byte> bytes, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(auto file, create(path, deadline));
  ZW_RETURN_IF_ERROR(file->write_at(0, bytes, deadline));
  ZW_RETURN_IF_ERROR(file->sync(deadline));
  return file->close(deadline);
}

}  // namespace zerowait
