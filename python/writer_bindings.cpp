// zerowait._core._DatasetWriter: the C++ DatasetWriter for zerowait.ShardWriter
// (python/zerowait/writer.py), which turns Python values into field bytes. Fields arrive as
// objects with the buffer protocol and are written without a copy, with the GIL released.
#include <pybind11/stl.h>

#include "common.hpp"
#include "zerowait/shard/dataset_writer.hpp"

namespace zerowait {
namespace {

class PyDatasetWriter {
 public:
  explicit PyDatasetWriter(DatasetWriterOptions options)
      : writer_(value_or_throw(without_gil([&] { return DatasetWriter::create(options); }))) {}

  // `fields`: (name, bytes-like) pairs. False when the sample was quarantined.
  bool write(const std::string& key, const py::list& fields) {
    DatasetWriter& writer = open_writer();
    std::vector<std::string> names;
    std::vector<py::buffer_info> buffers;
    names.reserve(fields.size());
    buffers.reserve(fields.size());
    for (py::handle item : fields) {
      auto pair = item.cast<py::tuple>();
      names.push_back(pair[0].cast<std::string>());
      buffers.push_back(pair[1].cast<py::buffer>().request());
      if (!PyBuffer_IsContiguous(buffers.back().view(), 'C')) {
        throw py::value_error("field '" + names.back() + "' of sample '" + key +
                              "': its buffer is not contiguous");
      }
    }
    std::vector<FieldData> data;
    for (size_t i = 0; i < names.size(); ++i) {
      const py::buffer_info& b = buffers[i];
      data.push_back({names[i], {static_cast<const std::byte*>(b.ptr),
                                 static_cast<size_t>(b.size * b.itemsize)}});
    }
    return value_or_throw(without_gil([&] { return writer.write(key, data); }));
  }

  py::dict finish() {
    DatasetWriter& writer = open_writer();
    Result<DatasetWriterReport> finished = without_gil([&] { return writer.finish(); });
    writer_.reset();
    const DatasetWriterReport report = value_or_throw(std::move(finished));
    py::list quarantined;
    for (const QuarantineEntry& entry : report.quarantined) {
      py::dict q;
      q["sample"] = fs_str(entry.path.substr(entry.path.find(' ') + 1));
      q["reason"] = entry.reason;
      quarantined.append(std::move(q));
    }
    return written_dataset_report(report, std::move(quarantined));
  }

  // Drops the writer without a manifest (an error in the caller's loop): no dataset is published.
  void abort() {
    without_gil([&] { writer_.reset(); });
  }

  bool closed() const { return writer_ == nullptr; }
  uint64_t samples() const { return writer_ ? writer_->samples() : 0; }
  uint64_t quarantined() const { return writer_ ? writer_->quarantined() : 0; }
  uint64_t bytes_written() const { return writer_ ? writer_->bytes_written() : 0; }

 private:
  DatasetWriter& open_writer() {
    if (!writer_) throw py::value_error("the writer is closed: it writes nothing more");
    return *writer_;
  }

  std::unique_ptr<DatasetWriter> writer_;
};

}  // namespace

void bind_writer(py::module_& m) {
  const DatasetWriterOptions defaults;
  py::class_<PyDatasetWriter>(m, "_DatasetWriter")
      .def(py::init([](py::handle out_dir, uint64_t shard_size, bool align, bool verify_images,
                       bool overwrite, bool sync, std::vector<std::string> classes,
                       py::handle tmp_dir) {
             DatasetWriterOptions o;
             o.out_dir = fs_path(out_dir);
             o.shard_size = shard_size;
             o.align = align;
             o.verify_images = verify_images;
             o.overwrite = overwrite;
             o.sync = sync;
             o.classes = std::move(classes);
             if (!tmp_dir.is_none()) o.tmp_dir = fs_path(tmp_dir);
             return std::make_unique<PyDatasetWriter>(std::move(o));
           }),
           py::arg("out_dir"), py::kw_only(), py::arg("shard_size") = defaults.shard_size,
           py::arg("align") = defaults.align, py::arg("verify_images") = defaults.verify_images,
           py::arg("overwrite") = defaults.overwrite, py::arg("sync") = defaults.sync,
           py::arg("classes") = std::vector<std::string>{}, py::arg("tmp_dir") = py::none())
      .def("write", &PyDatasetWriter::write, py::arg("key"), py::arg("fields"))
      .def("finish", &PyDatasetWriter::finish)
      .def("abort", &PyDatasetWriter::abort)
      .def_property_readonly("closed", &PyDatasetWriter::closed)
      .def_property_readonly("samples", &PyDatasetWriter::samples)
      .def_property_readonly("quarantined", &PyDatasetWriter::quarantined)
      .def_property_readonly("bytes_written", &PyDatasetWriter::bytes_written);
}

}  // namespace zerowait
