// zerowait._core's checkpoint classes: the native engine under zerowait.Checkpointer
// (python/zerowait/checkpoint.py), which flattens a state into tensors and a structure and
// rebuilds it. Tensor memory is passed as addresses (torch's data_ptr()); every call that
// copies, writes, waits or reads releases the GIL.
#include <pybind11/stl.h>

#include <chrono>
#include <optional>

#include "checkpoint/checkpoint_manifest.hpp"
#include "common.hpp"
#include "common/clock.hpp"
#include "zerowait/checkpoint/checkpointer.hpp"
#include "zerowait/checkpoint/maintenance.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/checkpoint/restore.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

using internal::from_seconds;

double default_read_timeout_s() { return internal::seconds(kDefaultReadTimeout); }

// A checkpoint directory or s3://BUCKET/PREFIX (other URLs are refused by name when used).
std::shared_ptr<Store> checkpoint_target(py::handle directory) {
  return value_or_throw(open_store(fs_path(directory)));
}

py::dict save_result_dict(const SaveResult& r) {
  py::dict d;
  d["step"] = r.step;
  d["committed"] = r.committed;
  d["bytes_total"] = r.bytes_total;
  d["bytes_written"] = r.bytes_written;
  d["tensors_written"] = r.tensors_written;
  d["tensors_referenced"] = r.tensors_referenced;
  d["snapshot_s"] = r.snapshot_s;
  d["copy_s"] = r.copy_s;
  d["device_wait_s"] = r.device_wait_s;
  d["write_s"] = r.write_s;
  d["commit_s"] = r.commit_s;
  return d;
}

// The rank manifest as Python sees it: the document of docs/checkpoint-manifest.schema.json,
// encoded by the same function that writes it to disk (hex xxh3, "nbytes", parsed "structure").
py::object manifest_object(const RankManifest& m) {
  return py::module_::import("json").attr("loads")(internal::encode_rank_manifest(m));
}

// The tensors of a save, from _Snapshot.tensors: rows (name, safetensors dtype, shape, element
// size, floating point, address, nbytes). Read field by field rather than through pybind11's
// tuple caster, which took a microsecond a row: thousands of rows were a third of save().
std::vector<TensorToSave> tensors_to_save(py::handle rows) {
  if (!PyList_Check(rows.ptr())) throw py::type_error("tensors must be a list of tuples");
  std::vector<TensorToSave> tensors(static_cast<size_t>(PyList_GET_SIZE(rows.ptr())));
  for (size_t i = 0; i < tensors.size(); ++i) {
    PyObject* row = PyList_GET_ITEM(rows.ptr(), static_cast<Py_ssize_t>(i));
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 7) {
      throw py::type_error("tensor " + std::to_string(i) + ": not a tuple of 7 fields");
    }
    auto field = [row](Py_ssize_t k) { return py::handle(PyTuple_GET_ITEM(row, k)); };
    TensorToSave& t = tensors[i];
    t.name = field(0).cast<std::string>();
    t.dtype = field(1).cast<std::string>();
    py::handle shape = field(2);
    if (!PyList_Check(shape.ptr())) {
      throw py::type_error("tensor '" + t.name + "': its shape is not a list");
    }
    t.shape.resize(static_cast<size_t>(PyList_GET_SIZE(shape.ptr())));
    for (size_t d = 0; d < t.shape.size(); ++d) {
      t.shape[d] = py::handle(PyList_GET_ITEM(shape.ptr(), static_cast<Py_ssize_t>(d)))
                       .cast<int64_t>();
    }
    t.element_size = field(3).cast<uint32_t>();
    t.floating_point = field(4).cast<bool>();
    t.data = reinterpret_cast<const void*>(field(5).cast<uintptr_t>());
    t.nbytes = field(6).cast<uint64_t>();
  }
  return tensors;
}

// One rank's validated manifest of a committed step (tests and tools look inside steps with it).
class CheckpointReader {
 public:
  CheckpointReader(py::handle directory, uint64_t step, uint32_t rank)
      : target_(checkpoint_target(directory)) {
    manifest_ =
        value_or_throw(without_gil([&] { return read_rank_manifest(*target_, step, rank); }));
  }
  py::object manifest() const { return manifest_object(manifest_); }
  // Reads tensors of this rank's part, verified, into host memory: (manifest index, address)
  // pairs. Sharded restores read the pieces of saved chunks they need with it, from any rank.
  void read(const std::vector<std::tuple<size_t, uintptr_t>>& wanted, unsigned threads, bool direct,
            double read_timeout_s) {
    std::vector<TensorRead> reads;
    for (const auto& [index, address] : wanted) {
      reads.push_back({index, reinterpret_cast<std::byte*>(address)});
    }
    const RestoreOptions options{threads, direct, true, from_seconds(read_timeout_s)};
    throw_if_error(without_gil([&] { return read_tensors(*target_, manifest_, reads, options); }));
  }

 private:
  std::shared_ptr<Store> target_;
  RankManifest manifest_;
};

// restore_newest() for Checkpointer.load(): `plan(manifest, step, tier, local_root)` (Python,
// under the GIL; local_root: the copy's directory on this machine, None for a store that is not
// one) allocates or maps the tensors of the copy being tried and returns their reads
// (TensorRead's fields as (index, address, fresh, device, cudaStream_t, mapped));
// `on_skip(step, tier, listed, message, next_step, next_tier)` is told of each copy given up, in
// order. The reads run without the GIL. A CorruptDataError from `plan` (a damaged state
// structure) gives the copy up; any other Python exception from either callback ends the restore
// and is re-raised.
py::dict restore_newest_py(py::handle directory, py::object mirror, std::optional<uint64_t> step,
                           uint32_t rank, bool fallback, py::function plan, py::function on_skip,
                           unsigned threads, bool direct, double read_timeout_s) {
  auto primary = checkpoint_target(directory);
  std::shared_ptr<Store> mirror_target;
  if (!mirror.is_none()) mirror_target = checkpoint_target(mirror);
  std::exception_ptr raised;
  RestoreNewestOptions options;
  options.step = step;
  options.rank = rank;
  options.fallback = fallback;
  options.on_skip = [&](const SkippedCopy& skipped, uint64_t next_step, Tier next_tier) {
    if (raised) return;
    py::gil_scoped_acquire gil;
    try {
      on_skip(skipped.step, tier_name(skipped.tier), skipped.listed, skipped.why.message(),
              next_step, tier_name(next_tier));
    } catch (...) {
      raised = std::current_exception();
    }
  };
  const RestoreOptions read{threads, direct, true, from_seconds(read_timeout_s)};
  auto restored = without_gil([&] {
    return restore_newest(*primary, mirror_target.get(), options, [&](const StepCopy& copy) {
      if (raised) return Status(ErrorCode::kCancelled, "a Python callback raised");
      std::vector<TensorRead> reads;
      {
        py::gil_scoped_acquire gil;
        try {
          const std::optional<std::string> local_root = copy.target->local_file("");
          py::object planned = plan(manifest_object(*copy.manifest), copy.step,
                                    tier_name(copy.tier), local_root ? py::cast(*local_root)
                                                                     : py::none());
          using Planned = std::tuple<size_t, uintptr_t, bool, int, uintptr_t, bool>;
          for (const auto& [index, address, fresh, device, stream, mapped] :
               planned.cast<std::vector<Planned>>()) {
            reads.push_back({index, reinterpret_cast<std::byte*>(address), fresh, device,
                             reinterpret_cast<void*>(stream), mapped});
          }
        } catch (py::error_already_set& error) {
          // A copy whose structure Python finds damaged is given up like any damaged copy.
          if (error.matches(py::module_::import("zerowait._core").attr("CorruptDataError"))) {
            return corrupt(py::str(error.value()).cast<std::string>());
          }
          raised = std::current_exception();
          return Status(ErrorCode::kCancelled, "a Python callback raised");
        } catch (...) {
          raised = std::current_exception();
          return Status(ErrorCode::kCancelled, "a Python callback raised");
        }
      }
      return read_tensors(*copy.target, *copy.manifest, reads, read);
    });
  });
  if (raised) std::rethrow_exception(raised);
  const RestoredStep r = value_or_throw(std::move(restored));
  py::dict d;
  d["step"] = r.step;
  d["tier"] = tier_name(r.tier);
  return d;
}

}  // namespace

void bind_checkpoint(py::module_& m) {
  py::class_<SaveHandle>(m, "_SaveHandle")
      .def_property_readonly("step", &SaveHandle::step)
      .def("done", &SaveHandle::done)
      .def(
          "wait",
          [](const SaveHandle& h, std::optional<double> timeout_s) {
            const Deadline deadline =
                timeout_s ? Deadline::after(from_seconds(*timeout_s)) : Deadline::none();
            return save_result_dict(value_or_throw(without_gil([&] { return h.wait(deadline); })));
          },
          py::arg("timeout_s") = py::none())
      .def("wait_part",
           [](const SaveHandle& h) { throw_if_error(without_gil([&] { return h.wait_part(); })); })
      .def("copied", &SaveHandle::copied)
      .def(
          "wait_copied",
          [](const SaveHandle& h, std::optional<double> timeout_s) {
            const Deadline deadline =
                timeout_s ? Deadline::after(from_seconds(*timeout_s)) : Deadline::none();
            throw_if_error(without_gil([&] { return h.wait_copied(deadline); }));
          },
          py::arg("timeout_s") = py::none())
      // None: the copy is exact; a message: the save fails with it (cancelled: a torn snapshot).
      .def(
          "confirm_copy",
          [](const SaveHandle& h, std::optional<std::string> torn) {
            h.confirm_copy(torn ? Status(ErrorCode::kCancelled, *torn) : Status::ok());
          },
          py::arg("torn") = py::none());

  py::class_<PendingSave>(m, "_PendingSave")
      .def("staging",
           [](const PendingSave& p, size_t i) {
             std::byte* address = p.staging(i);
             if (address == nullptr) {
               throw StatusError(invalid_argument("no staging for tensor " + std::to_string(i) +
                                                  ": out of range, or the save was started"));
             }
             return reinterpret_cast<uintptr_t>(address);
           })
      .def("copy_host_tensors",
           [](PendingSave& p, std::optional<std::vector<size_t>> indices) {
             throw_if_error(without_gil(
                 [&] { return indices ? p.copy_host_tensors(*indices) : p.copy_host_tensors(); }));
           },
           py::arg("indices") = py::none())
      .def(
          "wait_for_stream",
          [](PendingSave& p, uintptr_t cuda_stream, int device) {
            throw_if_error(p.wait_for_stream(reinterpret_cast<void*>(cuda_stream), device));
          },
          py::arg("cuda_stream"), py::arg("device"))
      .def("start", [](PendingSave& p) { return value_or_throw(p.start()); })
      .def("start_copying", [](PendingSave& p) { return value_or_throw(p.start_copying()); });

  py::class_<Checkpointer>(m, "_Checkpointer")
      .def(py::init([](py::handle directory, uint32_t keep_last, uint64_t keep_every,
                       py::object mirror, const std::string& compression, int zstd_level,
                       bool incremental, uint64_t max_file_bytes, unsigned threads, uint32_t rank,
                       uint32_t world_size, bool caller_coordinates, double commit_timeout_s,
                       std::string run_id) {
             CheckpointOptions o;
             o.keep_last = keep_last;
             o.keep_every = keep_every;
             o.compression = value_or_throw(parse_compression(compression));
             o.zstd_level = zstd_level;
             o.incremental = incremental;
             o.max_file_bytes = max_file_bytes;
             o.threads = threads;
             o.rank = rank;
             o.world_size = world_size;
             o.caller_coordinates = caller_coordinates;
             o.commit_timeout_s = commit_timeout_s;
             o.run_id = std::move(run_id);
             // A local directory or s3://BUCKET/PREFIX; Checkpointer::open refuses other URLs,
             // naming them as the directory or the mirror.
             if (!mirror.is_none()) o.mirror = checkpoint_target(mirror);
             auto target = checkpoint_target(directory);
             return value_or_throw(without_gil([&] { return Checkpointer::open(target, o); }));
           }),
           py::arg("directory"), py::kw_only(), py::arg("keep_last") = 0, py::arg("keep_every") = 0,
           py::arg("mirror") = py::none(), py::arg("compression") = "none",
           py::arg("zstd_level") = 3, py::arg("incremental") = false,
           py::arg("max_file_bytes") = CheckpointOptions{}.max_file_bytes, py::arg("threads") = 0,
           py::arg("rank") = 0, py::arg("world_size") = 1, py::arg("caller_coordinates") = false,
           py::arg("commit_timeout_s") = CheckpointOptions{}.commit_timeout_s,
           py::arg("run_id") = "")
      .def_property_readonly("run_id", [](Checkpointer& c) { return c.options().run_id; })
      .def(
          "begin_save",
          [](Checkpointer& c, uint64_t step, py::handle tensors, std::string structure_json,
             bool skip_if_busy) -> std::optional<PendingSave> {
            SaveRequest request;
            request.step = step;
            request.structure_json = std::move(structure_json);
            request.tensors = tensors_to_save(tensors);
            return value_or_throw(
                without_gil([&] { return c.begin_save(std::move(request), skip_if_busy); }));
          },
          py::arg("step"), py::arg("tensors"), py::arg("structure_json"),
          py::arg("skip_if_busy") = false)
      .def(
          "commit",
          [](Checkpointer& c, uint64_t step) {
            throw_if_error(without_gil([&] { return c.commit(step); }));
          },
          py::arg("step"))
      .def(
          "finish",
          [](Checkpointer& c, const SaveHandle& h, bool committed, const std::string& why) {
            c.finish(h, committed, committed ? Status::ok() : Status(ErrorCode::kIo, why));
          },
          py::arg("handle"), py::arg("committed"), py::arg("why") = "")
      .def("wait_all",
           [](Checkpointer& c) { throw_if_error(without_gil([&] { return c.wait_all(); })); });

  py::class_<CheckpointReader>(m, "_CheckpointReader")
      .def(py::init<py::handle, uint64_t, uint32_t>(), py::arg("directory"), py::arg("step"),
           py::arg("rank") = 0)
      .def("manifest", &CheckpointReader::manifest)
      .def("read", &CheckpointReader::read, py::arg("reads"), py::kw_only(), py::arg("threads") = 0,
           py::arg("direct") = true, py::arg("read_timeout_s") = default_read_timeout_s());

  m.attr("_ckpt_host_memory") = kHostMemory;
  m.attr("_ckpt_host_through_staging") = kHostThroughStaging;
  m.def("_ckpt_restore_newest", &restore_newest_py, py::arg("directory"), py::arg("mirror"),
        py::arg("step"), py::arg("rank"), py::arg("fallback"), py::arg("plan"), py::arg("on_skip"),
        py::kw_only(), py::arg("threads") = 0, py::arg("direct") = true,
        py::arg("read_timeout_s") = default_read_timeout_s());
  m.def("_ckpt_list_steps", [](py::handle directory) {
    auto target = checkpoint_target(directory);
    return value_or_throw(without_gil([&] { return list_steps(*target); }));
  });
  m.def("_ckpt_step_info", [](py::handle directory, uint64_t step) {
    auto target = checkpoint_target(directory);
    const StepInfo info =
        value_or_throw(without_gil([&] { return read_step_info(*target, step); }));
    py::dict d;
    d["step"] = info.step;
    d["run_id"] = info.run_id;
    d["world_size"] = info.world_size;
    d["bytes_total"] = info.bytes_total;
    d["bytes_stored"] = info.bytes_stored;
    d["references"] = info.references;
    d["created"] = info.created;
    return d;
  });
  m.def("_ckpt_verify", [](py::handle directory, uint64_t step) {
    auto target = checkpoint_target(directory);
    const VerifyReport r = value_or_throw(without_gil([&] { return verify_step(*target, step); }));
    py::dict d;
    d["step"] = r.step;
    d["files"] = r.files;
    d["bytes"] = r.bytes;
    d["tensors"] = r.tensors;
    d["problems"] = r.problems;
    return d;
  });
  m.def(
      "_ckpt_gc",
      [](py::handle directory, uint32_t keep_last, uint64_t keep_every) {
        auto target = checkpoint_target(directory);
        const GcReport r = value_or_throw(
            without_gil([&] { return collect_garbage(*target, keep_last, keep_every, true); }));
        py::dict d;
        d["removed"] = r.removed;
        d["bytes_freed"] = r.bytes_freed;
        return d;
      },
      py::arg("directory"), py::arg("keep_last") = 0, py::arg("keep_every") = 0);
}

}  // namespace zerowait
