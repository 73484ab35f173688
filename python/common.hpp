// What the binding files share: path and string conversions, and carrying a failed Status to
// the exception translator (registered in bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/block_cache.hpp"

namespace py = pybind11;

namespace zerowait {

// ---------------------------------------------------------------------------------------------
// Conversions

// Paths and keys are bytes on Linux; decode them the way os.fsdecode does (surrogateescape), so
// any file name round-trips.
inline py::str fs_str(std::string_view s) {
  PyObject* o = PyUnicode_DecodeFSDefaultAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

// str, bytes or os.PathLike -> the file system bytes of the path.
inline std::string fs_path(py::handle obj) {
  py::object encoded = py::module_::import("os").attr("fsencode")(obj);
  return encoded.cast<std::string>();
}

inline bool is_path_like(py::handle obj) {
  return py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) ||
         py::hasattr(obj, "__fspath__");
}

inline py::list str_list(const std::vector<std::string>& values) {
  py::list out;
  for (const std::string& v : values) out.append(fs_str(v));
  return out;
}

// What pack() and ShardWriter.close() report alike about the dataset they wrote: samples, shards,
// bytes_in, bytes_out, seconds, manifest_path, and `quarantined` as the caller lists it.
template <typename Report>
py::dict written_dataset_report(const Report& report, py::list quarantined) {
  py::dict out;
  out["samples"] = report.samples;
  out["shards"] = report.shards;
  out["bytes_in"] = report.bytes_in;
  out["bytes_out"] = report.bytes_out;
  out["seconds"] = report.seconds;
  out["quarantined"] = std::move(quarantined);
  out["manifest_path"] = fs_str(report.manifest_path);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Errors

// Carries a failed Status out of the GIL-free part of a call to the exception translator.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return status_.message().c_str(); }

 private:
  Status status_;
};

inline void throw_if_error(const Status& status) {
  if (!status.is_ok()) throw StatusError(status);
}

template <typename T>
T value_or_throw(Result<T>&& result) {
  if (!result.is_ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// Runs `work` (blocking C++: I/O, waits) with the GIL released and returns its result; the GIL
// is held again before the caller turns an error into an exception.
template <typename Work>
auto without_gil(Work&& work) {
  py::gil_scoped_release release;
  return work();
}

// What a Python `cache_dir=` asks for: None, the default (remote data through the node's default
// cache); False, no cache; a path, that directory. A URL or True is refused (ValueError).
struct CacheChoice {
  bool off = false;
  std::string directory;  // empty: the default
};
CacheChoice cache_choice(py::handle cache_dir);

// The node-local block cache Dataset(cache_dir=) and Loader(cache_dir=) read the remote shards of
// `dataset_path` through, as `choice` asks: the named directory (capped at `capacity_bytes`; 0:
// half the free space), the default one for a remote dataset (open_default_block_cache), or null.
// Call without the GIL.
Result<std::shared_ptr<BlockCache>> open_block_cache_or_none(const CacheChoice& choice,
                                                             uint64_t capacity_bytes,
                                                             const std::string& dataset_path);

// Defined in loader_bindings.cpp.
void bind_loader(py::module_& m);
// Defined in checkpoint_bindings.cpp.
void bind_checkpoint(py::module_& m);
// Defined in state_walk.cpp.
void bind_state_walk(py::module_& m);
// Defined in writer_bindings.cpp.
void bind_writer(py::module_& m);
// Defined in observe_bindings.cpp.
void bind_observe(py::module_& m);
// Defined in gds_bindings.cpp.
void bind_gds(py::module_& m);

}  // namespace zerowait
