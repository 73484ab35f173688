// Reads into GPU memory (include/zerowait/io/device_reader.hpp) for zerowait.gds: a file's byte
// ranges, and a dataset field's bytes for some samples, straight into the memory of CUDA
// tensors, whose addresses come from Python as integers. Reads release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "common/clock.hpp"
#include "storage/local_path.hpp"
#include "zerowait/storage/device_reader.hpp"
#include "zerowait/shard/dataset.hpp"

namespace zerowait {
namespace {

Deadline deadline_after(std::optional<double> timeout_s) {
  return timeout_s ? Deadline::after(internal::from_seconds(*timeout_s)) : Deadline::none();
}

DeviceReaderOptions reader_options(const std::string& gds, bool direct, size_t bounce_bytes) {
  return {value_or_throw(parse_gds_mode(gds)), direct, bounce_bytes};
}

py::dict stats_dict(const DeviceReaderStats& s) {
  py::dict d;
  d["path"] = s.path;
  d["reason"] = fs_str(s.reason);
  d["cufile_compat_mode"] = s.cufile_compat_mode;
  d["direct"] = s.direct;
  d["requests"] = s.requests;
  d["cufile_bytes"] = s.cufile_bytes;
  d["posix_bytes"] = s.posix_bytes;
  d["gds_fallbacks"] = s.gds_fallbacks;
  d["direct_fallbacks"] = s.direct_fallbacks;
  return d;
}

// What Python holds: the reader, or null once closed.
struct PyDeviceReader {
  std::shared_ptr<DeviceReader> reader;

  DeviceReader& get() const {
    if (reader == nullptr) throw py::value_error("the GDS reader is closed");
    return *reader;
  }
};

using PyRequest = std::tuple<uint64_t, uint64_t, uintptr_t>;  // (file offset, size, address)

std::vector<DeviceReadRequest> to_requests(const std::vector<PyRequest>& batch) {
  std::vector<DeviceReadRequest> requests;
  requests.reserve(batch.size());
  for (const auto& [offset, size, address] : batch) {
    requests.push_back({offset, size, reinterpret_cast<void*>(address)});
  }
  return requests;
}

// A dataset's shards, each read into GPU memory through its own DeviceReader (opened on first
// use): the bytes of one field of chosen samples, packed back to back.
class DatasetFieldReader {
 public:
  DatasetFieldReader(const std::string& path, DeviceReaderOptions options) : options_(options) {
    throw_if_error(internal::require_local_path(path, "dataset read into GPU memory"));
    dataset_ = value_or_throw(without_gil([&] { return Dataset::open(path); }));
  }

  // The field's byte size in each sample; a sample without it is kInvalidArgument naming it.
  std::vector<uint64_t> sizes(const std::vector<uint64_t>& indices, const std::string& field) {
    const std::vector<Location> where = locate(indices, field);
    std::vector<uint64_t> sizes;
    for (const Location& l : where) sizes.push_back(l.size);
    return sizes;
  }

  // Reads the field of samples `indices` to `address + destinations[i]`, each `sizes(...)[i]`.
  void read(const std::vector<uint64_t>& indices, const std::string& field, uintptr_t address,
            const std::vector<uint64_t>& destinations, std::optional<double> timeout_s) {
    if (destinations.size() != indices.size()) {
      throw py::value_error("one destination offset per index is needed");
    }
    const std::vector<Location> where = locate(indices, field);
    const Deadline deadline = deadline_after(timeout_s);
    throw_if_error(without_gil([&]() -> Status {
      std::lock_guard<std::mutex> lock(mutex_);
      std::map<size_t, std::vector<DeviceReadRequest>> by_shard;
      for (size_t i = 0; i < where.size(); ++i) {
        by_shard[where[i].shard].push_back(
            {where[i].offset, where[i].size,
             reinterpret_cast<std::byte*>(address) + destinations[i]});
      }
      for (const auto& [shard, requests] : by_shard) {
        ZW_ASSIGN_OR_RETURN(DeviceReader * reader, reader_of(shard));
        ZW_RETURN_IF_ERROR(reader->read(requests, deadline));
      }
      return Status::ok();
    }));
  }

  // Every shard reader's stats, summed; `path` and `reason` are the last opened reader's.
  py::dict stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceReaderStats total;
    for (const auto& [shard, reader] : readers_) {
      const DeviceReaderStats s = reader->stats();
      total.path = s.path;
      total.reason = s.reason;
      total.cufile_compat_mode = s.cufile_compat_mode;
      total.direct = s.direct;
      total.requests += s.requests;
      total.cufile_bytes += s.cufile_bytes;
      total.posix_bytes += s.posix_bytes;
      total.gds_fallbacks += s.gds_fallbacks;
      total.direct_fallbacks += s.direct_fallbacks;
    }
    py::dict d = stats_dict(total);
    d["shards_open"] = readers_.size();
    return d;
  }

  size_t size() const { return dataset_->size(); }

 private:
  struct Location {
    size_t shard = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
  };

  std::vector<Location> locate(const std::vector<uint64_t>& indices, const std::string& field) {
    std::vector<Location> out;
    out.reserve(indices.size());
    throw_if_error(without_gil([&]() -> Status {
      for (const uint64_t index : indices) {
        ZW_ASSIGN_OR_RETURN(const SampleLocation at, dataset_->locate(index));
        ZW_ASSIGN_OR_RETURN(std::shared_ptr<ShardReader> shard, dataset_->shard(at.shard));
        const format::ShardIndex& shard_index = shard->index();
        bool found = false;
        for (const format::FieldEntry& f : shard_index.fields_of(at.local)) {
          if (shard_index.names[f.name_id] == field) {
            out.push_back({at.shard, f.offset, f.size});
            found = true;
            break;
          }
        }
        if (!found) {
          return invalid_argument("sample " + std::to_string(index) + " ('" +
                                  std::string(shard->key(at.local)) + "' in " + shard->name() +
                                  ") has no field '" + field + "'");
        }
      }
      return Status::ok();
    }));
    return out;
  }

  Result<DeviceReader*> reader_of(size_t shard) {
    auto it = readers_.find(shard);
    if (it == readers_.end()) {
      ZW_ASSIGN_OR_RETURN(std::unique_ptr<DeviceReader> reader,
                          DeviceReader::open(dataset_->shard_path(shard), options_));
      it = readers_.emplace(shard, std::move(reader)).first;
    }
    return it->second.get();
  }

  DeviceReaderOptions options_;
  std::shared_ptr<Dataset> dataset_;
  mutable std::mutex mutex_;  // guards readers_ (reads run without the GIL)
  std::map<size_t, std::unique_ptr<DeviceReader>> readers_;
};

py::dict evidence_dict() {
  const GdsEvidence e = without_gil([] { return gds_evidence(); });
  py::dict facts;
  for (const auto& [name, value] : e.facts) facts[py::str(name)] = fs_str(value);
  py::dict d;
  d["cufile_usable"] = e.cufile_usable;
  d["compat_mode"] = e.compat_mode;
  d["summary"] = fs_str(e.summary);
  d["facts"] = facts;
  return d;
}

}  // namespace

void bind_gds(py::module_& m) {
  py::class_<PyDeviceReader>(m, "GdsReader",
                             "A file open for reads into GPU memory (zerowait.gds.GdsReader).")
      .def(py::init([](py::handle path, const std::string& gds, bool direct, size_t bounce_bytes) {
             const std::string file = fs_path(path);
             const DeviceReaderOptions options = reader_options(gds, direct, bounce_bytes);
             return PyDeviceReader{
                 value_or_throw(without_gil([&] { return DeviceReader::open(file, options); }))};
           }),
           py::arg("path"), py::arg("gds") = "auto", py::arg("direct") = true,
           py::arg("bounce_bytes") = DeviceReaderOptions{}.bounce_bytes)
      .def(
          "read",
          [](PyDeviceReader& self, uintptr_t address, uint64_t size, uint64_t offset,
             std::optional<double> timeout_s) {
            DeviceReader& reader = self.get();
            const Deadline deadline = deadline_after(timeout_s);
            throw_if_error(without_gil([&] {
              return reader.read(reinterpret_cast<void*>(address), size, offset, deadline);
            }));
          },
          py::arg("address"), py::arg("size"), py::arg("offset"), py::arg("timeout_s") = py::none())
      .def(
          "read_batch",
          [](PyDeviceReader& self, const std::vector<PyRequest>& batch,
             std::optional<double> timeout_s) {
            DeviceReader& reader = self.get();
            const std::vector<DeviceReadRequest> requests = to_requests(batch);
            const Deadline deadline = deadline_after(timeout_s);
            throw_if_error(without_gil([&] { return reader.read(requests, deadline); }));
          },
          py::arg("requests"), py::arg("timeout_s") = py::none(),
          "requests: [(file offset, size, device address)]")
      .def("stats", [](const PyDeviceReader& self) { return stats_dict(self.get().stats()); })
      .def_property_readonly("size", [](const PyDeviceReader& self) { return self.get().size(); })
      .def_property_readonly("path",
                             [](const PyDeviceReader& self) { return fs_str(self.get().path()); })
      .def("close", [](PyDeviceReader& self) { self.reader.reset(); });

  py::class_<DatasetFieldReader>(m, "GdsDatasetReader",
                                 "A dataset's field read into GPU memory (zerowait.gds).")
      .def(py::init([](py::handle path, const std::string& gds, bool direct) {
             return std::make_unique<DatasetFieldReader>(
                 fs_path(path), reader_options(gds, direct, DeviceReaderOptions{}.bounce_bytes));
           }),
           py::arg("path"), py::arg("gds") = "auto", py::arg("direct") = true)
      .def("sizes", &DatasetFieldReader::sizes, py::arg("indices"), py::arg("field"))
      .def("read", &DatasetFieldReader::read, py::arg("indices"), py::arg("field"),
           py::arg("address"), py::arg("destinations"), py::arg("timeout_s") = py::none())
      .def("stats", &DatasetFieldReader::stats)
      .def("__len__", &DatasetFieldReader::size);

  m.def("gds_evidence", &evidence_dict,
        "What this machine says about GPUDirect Storage: cufile_usable, compat_mode, summary, "
        "facts.");
}

}  // namespace zerowait
