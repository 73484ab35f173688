// Python bindings of the Loader. Batches reach Python as numpy arrays without a copy here: a small
// column (kOwnedColumnMaxBytes) is already a copy of its own, made on the worker thread, and its
// array keeps only that copy alive; a large column's array points into the batch arena and its
// base is a Batch::view, so the arena goes back to the pool when the last array (or torch tensor
// made from one) of a large column is freed, and the loader can name the columns still held.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common.hpp"
#include "common/clock.hpp"
#include "decode_bindings.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"

namespace zerowait {

namespace {

// numa=None | "auto" | a node number; for "auto", the GPU's PCI address (zerowait/loader.py
// finds it through torch, "" without CUDA).
NumaRequest numa_request(py::handle numa, py::handle gpu_pci_bus_id) {
  NumaRequest request;
  if (numa.is_none()) return request;
  if (py::isinstance<py::str>(numa) && numa.cast<std::string>() == "auto") {
    request.kind = NumaRequest::Kind::kAuto;
    request.gpu_pci_bus_id = gpu_pci_bus_id.is_none() ? "" : gpu_pci_bus_id.cast<std::string>();
    return request;
  }
  if (py::isinstance<py::int_>(numa) && !py::isinstance<py::bool_>(numa)) {
    request.kind = NumaRequest::Kind::kNode;
    request.node = numa.cast<int>();
    return request;
  }
  throw StatusError(invalid_argument("numa must be None, \"auto\" or a node number, not " +
                                     py::repr(numa).cast<std::string>()));
}

// Destroying a loader stops and joins its worker threads, which may be waiting on reads: that
// happens without the GIL, so Python threads (a server in this process feeding those reads, a
// progress thread) keep running meanwhile instead of deadlocking with it.
struct DeleteWithoutGil {
  static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
  }
  void operator()(Loader* loader) const {
    if (PyGILState_Check() == 0 || finalizing()) {
      delete loader;
      return;
    }
    py::gil_scoped_release release;
    delete loader;
  }
};
using LoaderHolder = std::unique_ptr<Loader, DeleteWithoutGil>;

LoaderHolder make_loader(py::handle path, py::dict kw) {
  LoaderOptions o;
  auto get = [&](const char* name) { return kw[py::str(name)]; };
  o.batch_size = get("batch_size").cast<uint64_t>();
  o.shuffle.mode = value_or_throw(parse_shuffle_mode(get("shuffle").cast<std::string>()));
  o.shuffle.seed = get("seed").cast<uint64_t>();
  o.shuffle.block_samples = get("shuffle_block").cast<uint64_t>();
  o.shuffle.window_blocks = get("shuffle_window").cast<uint64_t>();
  o.shuffle.block_bytes = get("block_bytes").cast<uint64_t>();
  o.shuffle.window_bytes = get("window_bytes").cast<uint64_t>();
  o.shuffle.nodes = get("nodes").cast<uint32_t>();
  o.shuffle.node = get("node").cast<uint32_t>();
  o.shuffle.redeal_every = get("redeal_every").cast<uint64_t>();
  o.epoch = get("epoch").cast<uint64_t>();
  o.rank = get("rank").cast<uint32_t>();
  o.world_size = get("world_size").cast<uint32_t>();
  o.drop_last = get("drop_last").cast<bool>();
  o.threads = get("threads").cast<unsigned>();
  o.prefetch = get("prefetch").cast<unsigned>();
  o.memory_budget = get("memory_budget").cast<uint64_t>();
  o.io = value_or_throw(parse_io_backend(get("io").cast<std::string>()));
  o.on_corrupt = value_or_throw(parse_corrupt_policy(get("on_corrupt").cast<std::string>()));
  if (!get("fields").is_none()) o.fields = get("fields").cast<std::vector<std::string>>();
  if (!get("decode").is_none()) {
    for (auto [name, spec] : get("decode").cast<py::dict>()) {
      const std::string field = name.cast<std::string>();
      o.decode[field] = field_decode(spec, field);
    }
  }
  o.keys = get("keys").cast<bool>();
  o.verify = get("verify").cast<bool>();
  o.read_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      internal::from_seconds(get("read_timeout").cast<double>()));
  o.autotune = get("autotune").cast<bool>();
  o.pin_memory = get("pin_memory").cast<bool>();
  o.poison_released_arenas = get("poison_released").cast<bool>();
  o.numa = numa_request(get("numa"), get("numa_gpu_pci_bus_id"));

  const std::string dataset_path = fs_path(path);
  const CacheChoice cache_dir = cache_choice(get("cache_dir"));
  const uint64_t cache_bytes = get("cache_bytes").cast<uint64_t>();
  py::gil_scoped_release release;
  std::shared_ptr<BlockCache> cache =
      value_or_throw(open_block_cache_or_none(cache_dir, cache_bytes, dataset_path));
  return LoaderHolder(
      value_or_throw(Loader::open(dataset_path, std::move(o), std::move(cache))).release());
}

py::dtype numpy_dtype(DType dtype) { return py::dtype(std::string(dtype_name(dtype))); }

// A capsule that owns a copy of `owner` (a shared_ptr of any type): the base of a numpy array.
template <typename T>
py::capsule owning_capsule(std::shared_ptr<T> owner) {
  return py::capsule(new std::shared_ptr<T>(std::move(owner)),
                     [](void* p) { delete static_cast<std::shared_ptr<T>*>(p); });
}

// {"name": numpy array, ...} (see the top of this file), plus "__key__" when keys were asked.
py::dict batch_arrays(std::shared_ptr<const Batch> batch) {
  py::dict out;
  const std::vector<BatchColumn>& columns = batch->columns();
  for (size_t i = 0; i < columns.size(); ++i) {
    const BatchColumn& c = columns[i];
    py::capsule base =
        c.copy != nullptr ? owning_capsule(c.copy) : owning_capsule(Batch::view(batch, i));
    std::vector<py::ssize_t> shape(c.shape.begin(), c.shape.end());
    out[py::str(c.name)] = py::array(numpy_dtype(c.dtype), shape, c.data, base);
  }
  if (!batch->keys().empty()) {
    py::list keys;
    for (const std::string& k : batch->keys()) keys.append(fs_str(k));
    out["__key__"] = keys;
  }
  return out;
}

// 2: the "random" order is a Feistel permutation (version 1 states of that order are refused).
constexpr int kLoaderStateVersion = 2;

py::dict state_to_dict(const LoaderState& s) {
  py::dict d;
  d["version"] = kLoaderStateVersion;
  d["epoch"] = s.epoch;
  d["position"] = s.position;
  d["seed"] = s.seed;
  d["shuffle"] = shuffle_mode_name(s.shuffle);
  d["shuffle_block"] = s.block_samples;
  d["shuffle_window"] = s.window_blocks;
  d["block_bytes"] = s.block_bytes;
  d["window_bytes"] = s.window_bytes;
  d["nodes"] = s.nodes;
  d["redeal_every"] = s.redeal_every;
  d["dataset_samples"] = s.dataset_samples;
  d["dataset_fingerprint"] = s.dataset_fingerprint;
  d["batch_size"] = s.batch_size;
  d["world_size"] = s.world_size;
  return d;
}

LoaderState state_from_dict(const py::dict& d) {
  const int version = d.contains("version") ? d["version"].cast<int>() : 0;
  if (version != 1 && version != kLoaderStateVersion) {
    throw StatusError(invalid_argument("not a zerowait loader state (version " +
                                       std::to_string(kLoaderStateVersion) + " expected)"));
  }
  // Version 1 states were saved before the "random" order became a Feistel permutation; their
  // "none" and "quasi" orders are unchanged.
  if (version == 1 && d["shuffle"].cast<std::string>() == "random") {
    throw StatusError(invalid_argument(
        "cannot resume: this loader state (version 1) was saved by a zerowait whose 'random' "
        "order differs from this one's, so the rest of the epoch would repeat and skip samples; "
        "start the next epoch instead (set 'position' to 0 and 'epoch' one higher) or resume "
        "with the version that saved it"));
  }
  LoaderState s;
  s.epoch = d["epoch"].cast<uint64_t>();
  s.position = d["position"].cast<uint64_t>();
  s.seed = d["seed"].cast<uint64_t>();
  s.shuffle = value_or_throw(parse_shuffle_mode(d["shuffle"].cast<std::string>()));
  s.block_samples = d["shuffle_block"].cast<uint64_t>();
  s.window_blocks = d["shuffle_window"].cast<uint64_t>();
  // States saved before the "block" order existed have no block sizes (and need none).
  const ShuffleOptions defaults;
  s.block_bytes = d.contains("block_bytes") ? d["block_bytes"].cast<uint64_t>()
                                            : defaults.block_bytes;
  s.window_bytes = d.contains("window_bytes") ? d["window_bytes"].cast<uint64_t>()
                                              : defaults.window_bytes;
  s.nodes = d.contains("nodes") ? d["nodes"].cast<uint32_t>() : defaults.nodes;
  s.redeal_every =
      d.contains("redeal_every") ? d["redeal_every"].cast<uint64_t>() : defaults.redeal_every;
  s.dataset_samples = d["dataset_samples"].cast<uint64_t>();
  s.dataset_fingerprint = d["dataset_fingerprint"].cast<uint64_t>();
  s.batch_size = d["batch_size"].cast<uint64_t>();
  s.world_size = d["world_size"].cast<uint32_t>();
  return s;
}

py::dict stats_to_dict(const LoaderStats& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["bytes_read"] = s.bytes_read;
  d["skipped"] = s.skipped;
  d["padded"] = s.padded;
  d["wait_s"] = s.wait_s;
  d["read_s"] = s.read_s;
  d["decode_s"] = s.decode_s;
  d["elapsed_s"] = s.elapsed_s;
  d["threads"] = s.threads;
  d["prefetch"] = s.prefetch;
  d["arenas"] = s.arenas;
  d["arenas_free"] = s.arenas_free;
  d["arena_bytes"] = s.arena_bytes;
  d["memory_budget"] = s.memory_budget;
  d["io"] = s.io;
  d["pinned"] = s.pinned;
  d["io_fallbacks"] = s.io_fallbacks;
  if (s.cache) {
    py::dict c;
    c["hits"] = s.cache->hits;
    c["misses"] = s.cache->misses;
    c["waits"] = s.cache->waits;
    c["evictions"] = s.cache->evictions;
    c["damaged"] = s.cache->damaged;
    c["prefetched"] = s.cache->prefetched;
    c["ranges_downloaded"] = s.cache->ranges_downloaded;
    c["bytes_ranges"] = s.cache->bytes_ranges;
    c["range_reads"] = s.cache->range_reads;
    c["bytes_hit"] = s.cache->bytes_hit;
    c["bytes_downloaded"] = s.cache->bytes_downloaded;
    c["bytes_evicted"] = s.cache->bytes_evicted;
    c["usage_bytes"] = s.cache->usage_bytes;
    c["capacity_bytes"] = s.cache->capacity_bytes;
    d["cache"] = c;
  } else {
    d["cache"] = py::none();
  }
  py::dict numa;
  switch (s.numa.requested) {
    case NumaRequest::Kind::kNone:
      numa["requested"] = py::none();
      break;
    case NumaRequest::Kind::kAuto:
      numa["requested"] = "auto";
      break;
    case NumaRequest::Kind::kNode:
      numa["requested"] = s.numa.requested_node;
      break;
  }
  numa["node"] = s.numa.node ? py::object(py::int_(*s.numa.node)) : py::none();
  numa["cpus"] = s.numa.cpus.empty() ? py::object(py::none()) : py::str(s.numa.cpus);
  numa["memory_policy"] = s.numa.memory_bound ? "bind" : "none";
  numa["reason"] = s.numa.reason;
  d["numa"] = numa;
  py::list steps;
  for (const StepStats& step : s.recent) {
    py::dict r;
    r["epoch"] = step.epoch;
    r["batch"] = step.batch;
    r["wait_s"] = step.wait_s;
    r["read_s"] = step.read_s;
    r["decode_s"] = step.decode_s;
    r["bytes_read"] = step.bytes_read;
    r["samples"] = step.samples;
    r["skipped"] = step.skipped;
    r["ready_batches"] = step.ready_batches;
    steps.append(r);
  }
  d["recent"] = steps;
  return d;
}

}  // namespace

void bind_loader(py::module_& m) {
  // The defaults of LoaderOptions, so the Python signature shows the C++ values (one source).
  const LoaderOptions defaults;
  py::dict d;
  d["batch_size"] = defaults.batch_size;
  d["shuffle"] = shuffle_mode_name(defaults.shuffle.mode);
  d["shuffle_block"] = defaults.shuffle.block_samples;
  d["shuffle_window"] = defaults.shuffle.window_blocks;
  d["block_bytes"] = defaults.shuffle.block_bytes;
  d["window_bytes"] = defaults.shuffle.window_bytes;
  d["prefetch"] = defaults.prefetch;
  d["memory_budget"] = defaults.memory_budget;
  d["read_timeout"] = internal::seconds(defaults.read_timeout);
  d["drop_last"] = defaults.drop_last;
  d["verify"] = defaults.verify;
  d["keys"] = defaults.keys;
  d["autotune"] = defaults.autotune;
  d["on_corrupt"] = defaults.on_corrupt == CorruptPolicy::kRaise ? "raise" : "skip";
  m.attr("LOADER_DEFAULTS") = d;

  bind_field_decoders(m);  // the decoders' options, before the loader that takes them

  py::class_<Loader, LoaderHolder>(m, "_Loader")
      .def(py::init(&make_loader), py::arg("path"), py::arg("options"))
      .def(
          "next",
          [](Loader& loader, std::optional<double> timeout_s) -> py::object {
            const Deadline deadline =
                timeout_s ? Deadline::after(internal::from_seconds(*timeout_s)) : Deadline::none();
            std::shared_ptr<Batch> b =
                value_or_throw(without_gil([&] { return loader.next(deadline); }));
            if (b == nullptr) return py::none();
            return batch_arrays(std::move(b));
          },
          py::arg("timeout_s") = py::none(),
          "The next batch as a dict of numpy arrays, or None at the end of the epoch; "
          "DeadlineExceededError after timeout_s seconds without one (nothing is lost).")
      .def("remaining_batches", &Loader::remaining_batches)
      .def("batches_per_epoch", &Loader::batches_per_epoch)
      .def_property_readonly("epoch", &Loader::epoch)
      .def("set_epoch", &Loader::set_epoch, py::arg("epoch"),
           py::call_guard<py::gil_scoped_release>())
      .def("state_dict", [](const Loader& l) { return state_to_dict(l.state()); })
      .def("load_state_dict",
           [](Loader& l, const py::dict& d) {
             LoaderState state = state_from_dict(d);
             throw_if_error(without_gil([&] { return l.load_state(state); }));
           })
      .def("stats", [](const Loader& l) { return stats_to_dict(l.stats()); })
      .def_property_readonly("wait_s", &Loader::wait_seconds,
                             "stats()['wait_s'] without the rest of stats()")
      .def(
          "describe_sample",
          [](const Loader& l, uint64_t index) {
            // For error messages: where a sample lies. Empty when it cannot be located.
            py::dict out;
            const Dataset& dataset = l.dataset();
            const Result<SampleLocation> location = dataset.locate(index);
            if (!location) return out;
            out["shard"] = fs_str(dataset.shard_path(location->shard));
            out["shard_index"] = location->local;
            const Result<std::shared_ptr<ShardReader>> reader = dataset.shard(location->shard);
            if (reader) out["key"] = fs_str((*reader)->key(location->local));
            return out;
          },
          py::arg("index"), "{shard, shard_index, key} of sample `index`, for messages.")
      .def("close", &Loader::close, py::call_guard<py::gil_scoped_release>());
}

}  // namespace zerowait
