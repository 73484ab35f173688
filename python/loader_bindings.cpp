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
#include "zerowait/loader/image_transform.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"

namespace zerowait {

namespace {

// zerowait.RandomResizedCrop(..., device="cuda"): the loader reads each JPEG's header and the
// GPU stage (zerowait/gpu_decode.py) decodes and crops it on `device`.
struct DeviceImageTransform {
  ImageTransform transform;
  std::string device;
};

std::string transform_repr(const ImageTransform& t, const std::string& device) {
  const bool rrc = t.mode == ImageTransform::Mode::kRandomResizedCrop;
  return std::string(rrc ? "RandomResizedCrop(" : "CenterCrop(") + std::to_string(t.size) +
         (t.random_flip ? ", flip=True" : "") + (t.dct_downscale ? "" : ", dct_downscale=False") +
         (device.empty() ? "" : ", device='" + device + "'") + ")";
}

FieldDecode field_decode(py::handle spec, const std::string& field) {
  FieldDecode decode;
  if (py::isinstance<ImageTransform>(spec)) {
    decode.kind = FieldDecode::Kind::kImage;
    decode.image = spec.cast<ImageTransform>();
    return decode;
  }
  if (py::isinstance<DeviceImageTransform>(spec)) {
    decode.kind = FieldDecode::Kind::kDeviceImage;
    decode.image = spec.cast<DeviceImageTransform>().transform;
    return decode;
  }
  if (py::isinstance<TokenWindow>(spec)) {
    decode.kind = FieldDecode::Kind::kTokens;
    decode.tokens = spec.cast<TokenWindow>();
    return decode;
  }
  if (py::isinstance<AudioClip>(spec)) {
    decode.kind = FieldDecode::Kind::kAudio;
    decode.audio = spec.cast<AudioClip>();
    return decode;
  }
  if (py::isinstance<ArrayField>(spec)) {
    decode.kind = FieldDecode::Kind::kArray;
    decode.array = spec.cast<ArrayField>();
    return decode;
  }
  if (py::isinstance<py::str>(spec)) {
    const std::string kind = spec.cast<std::string>();
    // "text" and "json" fields travel as raw bytes; zerowait.Loader makes them str / objects.
    if (kind == "raw" || kind == "text" || kind == "json") return decode;
    if (kind == "int") {
      decode.kind = FieldDecode::Kind::kInt;
      return decode;
    }
    if (kind == "npy") {
      decode.kind = FieldDecode::Kind::kArray;
      return decode;
    }
  }
  throw StatusError(invalid_argument(
      "decode['" + field + "'] must be \"raw\", \"int\", \"npy\", \"text\", \"json\", an " +
      "ImageTransform (zerowait.RandomResizedCrop / CenterCrop), a zerowait.TokenWindow, a " +
      "zerowait.Array or a zerowait.AudioClip, not " + py::repr(spec).cast<std::string>()));
}

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
  DatasetOptions dataset_options;
  dataset_options.backend = o.io;
  dataset_options.cache =
      value_or_throw(open_block_cache_or_none(cache_dir, cache_bytes, dataset_path));
  std::shared_ptr<Dataset> dataset = value_or_throw(Dataset::open(dataset_path, dataset_options));
  return LoaderHolder(value_or_throw(Loader::create(std::move(dataset), std::move(o))).release());
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

  const ImageTransform image_defaults;  // likewise for the transform's keyword defaults

  py::class_<ImageTransform>(m, "ImageTransform", R"doc(
How a JPEG field becomes a uint8 [size, size, 3] image. Build one with
zerowait.RandomResizedCrop(...) or zerowait.CenterCrop(...).
)doc")
      .def(py::init([](const std::string& mode, int size, int resize, double scale_min,
                       double scale_max, double ratio_min, double ratio_max, bool flip,
                       bool dct_downscale) {
             ImageTransform t;
             if (mode == "random_resized_crop") {
               t.mode = ImageTransform::Mode::kRandomResizedCrop;
             } else if (mode == "center_crop") {
               t.mode = ImageTransform::Mode::kResizeCenterCrop;
             } else {
               throw StatusError(invalid_argument("unknown image mode '" + mode +
                                                  "' (random_resized_crop or center_crop)"));
             }
             t.size = size;
             t.resize = resize;
             t.scale_min = scale_min;
             t.scale_max = scale_max;
             t.ratio_min = ratio_min;
             t.ratio_max = ratio_max;
             t.random_flip = flip;
             t.dct_downscale = dct_downscale;
             throw_if_error(t.validate());
             return t;
           }),
           py::arg("mode"), py::arg("size"), py::arg("resize") = image_defaults.resize,
           py::arg("scale_min") = image_defaults.scale_min,
           py::arg("scale_max") = image_defaults.scale_max,
           py::arg("ratio_min") = image_defaults.ratio_min,
           py::arg("ratio_max") = image_defaults.ratio_max,
           py::arg("flip") = image_defaults.random_flip,
           py::arg("dct_downscale") = image_defaults.dct_downscale)
      .def_readonly("size", &ImageTransform::size)
      .def_readonly("flip", &ImageTransform::random_flip)
      .def_readonly("dct_downscale", &ImageTransform::dct_downscale)
      .def_property_readonly("mode",
                             [](const ImageTransform& t) {
                               return t.mode == ImageTransform::Mode::kRandomResizedCrop
                                          ? "random_resized_crop"
                                          : "center_crop";
                             })
      .def(
          "crop_area",
          [](const ImageTransform& t, int width, int height, uint64_t seed, uint64_t epoch,
             uint64_t index) {
            if (width <= 0 || height <= 0) {
              throw StatusError(
                  invalid_argument("crop_area needs a positive width and height, "
                                   "got " +
                                   std::to_string(width) + "x" + std::to_string(height)));
            }
            const CropArea a = crop_area(width, height, t, augment_seed(seed, epoch, index));
            return py::make_tuple(a.x0, a.y0, a.x1, a.y1, a.flip);
          },
          py::arg("width"), py::arg("height"), py::arg("seed") = 0, py::arg("epoch") = 0,
          py::arg("index") = 0, R"doc(
The area (x0, y0, x1, y1, flip) of a width x height image that a Loader with this ``seed``
shows of sample ``index`` in ``epoch``, in pixels of the full-resolution image (fractional for
CenterCrop), and whether it is mirrored: what the ``"<field>.crop"`` column of a GPU-decoded
field holds.
)doc")
      .def("__repr__", [](const ImageTransform& t) { return transform_repr(t, ""); });

  py::class_<DeviceImageTransform>(m, "DeviceImageTransform", R"doc(
An ImageTransform decoded on a GPU: zerowait.RandomResizedCrop(..., device="cuda"). The loader's
threads read only each JPEG's header and deliver its bytes with the crop to take; zerowait's
GPU stage decodes and crops them on ``device`` (docs/loader.md, "GPU JPEG decode").
)doc")
      .def(py::init([](const ImageTransform& transform, const std::string& device) {
             return DeviceImageTransform{transform, device};
           }),
           py::arg("transform"), py::arg("device"))
      .def_property_readonly("transform", [](const DeviceImageTransform& d) { return d.transform; })
      .def_readonly("device", &DeviceImageTransform::device)
      .def_property_readonly("size", [](const DeviceImageTransform& d) { return d.transform.size; })
      .def("__repr__",
           [](const DeviceImageTransform& d) { return transform_repr(d.transform, d.device); });

  const TokenWindow token_defaults;
  py::class_<TokenWindow>(m, "TokenWindow", R"doc(
How a field holding a token sequence (a little-endian uint16, uint32 or int32 array, no header)
becomes a row of an int64 [batch, seq_len] tensor (int32 with ``out_dtype="int32"``: half the
bytes), with "<field>.lengths" (int64 [batch]) the
tokens of each row before its padding. Shorter sequences are padded with ``pad``; longer ones are
cut to ``seq_len`` tokens from their start, or with ``random_offset=True`` from an offset drawn
from (seed, epoch, sample index): the same after an exact resume. docs/loader.md.
)doc")
      .def(py::init([](uint32_t seq_len, const std::string& dtype, int64_t pad,
                       bool random_offset, const std::string& out_dtype) {
             TokenWindow t;
             t.seq_len = seq_len;
             t.dtype = value_or_throw(parse_token_dtype(dtype));
             t.pad = pad;
             t.random_offset = random_offset;
             if (out_dtype != "int64" && out_dtype != "int32") {
               throw StatusError(invalid_argument("TokenWindow out_dtype must be \"int64\" or "
                                                  "\"int32\", not \"" + out_dtype + "\""));
             }
             t.int32_rows = out_dtype == "int32";
             throw_if_error(t.validate());
             return t;
           }),
           py::arg("seq_len"), py::arg("dtype") = token_dtype_name(token_defaults.dtype),
           py::arg("pad") = token_defaults.pad,
           py::arg("random_offset") = token_defaults.random_offset,
           py::arg("out_dtype") = "int64")
      .def_readonly("seq_len", &TokenWindow::seq_len)
      .def_property_readonly("dtype",
                             [](const TokenWindow& t) { return token_dtype_name(t.dtype); })
      .def_readonly("pad", &TokenWindow::pad)
      .def_readonly("random_offset", &TokenWindow::random_offset)
      .def_property_readonly("out_dtype",
                             [](const TokenWindow& t) { return t.int32_rows ? "int32" : "int64"; })
      .def("__repr__", [](const TokenWindow& t) {
        return "TokenWindow(" + std::to_string(t.seq_len) + ", dtype='" +
               token_dtype_name(t.dtype) + "', pad=" + std::to_string(t.pad) +
               (t.random_offset ? ", random_offset=True" : "") +
               (t.int32_rows ? ", out_dtype='int32')" : ")");
      });

  py::class_<ArrayField>(m, "Array", R"doc(
How a field holding one NumPy array a sample becomes a row of a [batch, *shape] tensor: the
.npy format (numpy.save; what zerowait.write_dataset stores arrays and tensors as), or with
``header=False`` the bare bytes of an array of ``dtype`` and ``shape``. Without ``dtype`` the
first sample that has the field sets dtype and shape; every sample must match them, or it is a
corrupt sample (on_corrupt). Rows are copied as stored (C order, little-endian). docs/loader.md.
)doc")
      .def(py::init([](std::optional<std::string> dtype, std::optional<std::vector<int64_t>> shape,
                       bool header) {
             ArrayField a;
             if (dtype) a.dtype = value_or_throw(parse_dtype(*dtype));
             if (shape && !dtype) {
               throw StatusError(invalid_argument("Array(shape=...) needs a dtype as well"));
             }
             if (dtype && !shape) {
               throw StatusError(invalid_argument("Array(dtype=...) needs a shape as well"));
             }
             if (shape) a.shape = *shape;
             a.header = header;
             throw_if_error(a.validate());
             return a;
           }),
           py::arg("dtype") = py::none(), py::arg("shape") = py::none(), py::arg("header") = true)
      .def_property_readonly("dtype",
                             [](const ArrayField& a) -> py::object {
                               if (!a.dtype) return py::none();
                               return py::str(dtype_name(*a.dtype));
                             })
      .def_property_readonly("shape",
                             [](const ArrayField& a) -> py::object {
                               if (!a.dtype) return py::none();
                               return py::tuple(py::cast(a.shape));
                             })
      .def_readonly("header", &ArrayField::header)
      .def("__repr__", [](const ArrayField& a) {
        if (!a.dtype) return std::string(a.header ? "Array()" : "Array(header=False)");
        std::string shape = "(";
        for (size_t i = 0; i < a.shape.size(); ++i) {
          shape += (i ? ", " : "") + std::to_string(a.shape[i]);
        }
        shape += a.shape.size() == 1 ? ",)" : ")";
        return "Array(dtype='" + std::string(dtype_name(*a.dtype)) + "', shape=" + shape +
               (a.header ? ")" : ", header=False)");
      });

  const AudioClip audio_defaults;
  py::class_<AudioClip>(m, "AudioClip", R"doc(
How a field holding an audio file (WAV, FLAC, Ogg/Vorbis: whatever libsndfile reads) becomes a
row of a float32 [batch, channels, length] tensor, with "<field>.lengths" (int64 [batch]) the
frames of each row before its zero padding. Longer clips are cut to ``length`` frames, centred,
or with ``random_crop=True`` at an offset drawn from (seed, epoch, sample index): the same after
an exact resume; only those frames are decoded. ``channels=1`` averages a multi-channel file
down to mono; other counts must match the file. ``sample_rate`` (0: any) refuses files at
another rate: there is no resampling. A file that cannot be read is a corrupt sample.
docs/loader.md.
)doc")
      .def(py::init([](uint32_t length, uint32_t channels, uint32_t sample_rate,
                       bool random_crop) {
             AudioClip a;
             a.length = length;
             a.channels = channels;
             a.sample_rate = sample_rate;
             a.random_crop = random_crop;
             throw_if_error(a.validate());
             return a;
           }),
           py::arg("length"), py::arg("channels") = audio_defaults.channels,
           py::arg("sample_rate") = audio_defaults.sample_rate,
           py::arg("random_crop") = audio_defaults.random_crop)
      .def_readonly("length", &AudioClip::length)
      .def_readonly("channels", &AudioClip::channels)
      .def_readonly("sample_rate", &AudioClip::sample_rate)
      .def_readonly("random_crop", &AudioClip::random_crop)
      .def("__repr__", [](const AudioClip& a) {
        return "AudioClip(" + std::to_string(a.length) + ", channels=" +
               std::to_string(a.channels) + ", sample_rate=" + std::to_string(a.sample_rate) +
               (a.random_crop ? ", random_crop=True)" : ")");
      });

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
