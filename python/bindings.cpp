// The `zerowait._core` extension module. Statuses turn into Python exceptions here and only here,
// and every call that can block on I/O runs with the GIL released, so Python threads (a training
// loop, a progress bar) keep running while the C++ core reads, packs or verifies.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/storage/cache_directory.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/pack.hpp"
#include "zerowait/shard/reader.hpp"
#include "zerowait/shard/synthetic.hpp"
#include "zerowait/storage/url.hpp"

#ifndef ZEROWAIT_VERSION
#define ZEROWAIT_VERSION "0.0.0"
#endif

namespace py = pybind11;

namespace zerowait {
namespace {

// One Python exception class per error code. The references are owned by the module for the life
// of the interpreter; they are deliberately never released (the module cannot be unloaded).
struct ExceptionTypes {
  PyObject* base = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* not_found = nullptr;
  PyObject* already_exists = nullptr;
  PyObject* io = nullptr;
  PyObject* corrupt = nullptr;
  PyObject* unsupported = nullptr;
  PyObject* deadline_exceeded = nullptr;
  PyObject* cancelled = nullptr;
  PyObject* resource_exhausted = nullptr;
  PyObject* internal = nullptr;

  PyObject* for_code(ErrorCode code) const {
    switch (code) {
      case ErrorCode::kInvalidArgument:
        return invalid_argument;
      case ErrorCode::kNotFound:
        return not_found;
      case ErrorCode::kAlreadyExists:
        return already_exists;
      case ErrorCode::kIo:
        return io;
      case ErrorCode::kCorrupt:
        return corrupt;
      case ErrorCode::kUnsupported:
        return unsupported;
      case ErrorCode::kDeadlineExceeded:
        return deadline_exceeded;
      case ErrorCode::kCancelled:
        return cancelled;
      case ErrorCode::kResourceExhausted:
        return resource_exhausted;
      case ErrorCode::kOk:  // an ok Status is never thrown; treat it as the bug it would be
      case ErrorCode::kInternal:
        return internal;
    }
    return internal;
  }
};

ExceptionTypes g_exceptions;

// Creates `zerowait.<name>` deriving from `bases` and adds it to the module.
PyObject* add_exception(py::module_& m, const char* name, const char* doc,
                        std::initializer_list<PyObject*> bases) {
  py::tuple base_tuple(bases.size());
  size_t i = 0;
  for (PyObject* b : bases) base_tuple[i++] = py::handle(b);
  const std::string qualified = std::string("zerowait.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base_tuple.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));
  return type;
}

void register_exceptions(py::module_& m) {
  ExceptionTypes& e = g_exceptions;
  e.base = add_exception(m, "ZerowaitError",
                         "Base class of every error raised by zerowait. `code` holds the error "
                         "code name ('corrupt', 'not_found', ...).",
                         {PyExc_Exception});
  e.invalid_argument = add_exception(m, "InvalidArgumentError",
                                     "An unusable argument (bad option, out-of-range value).",
                                     {e.base, PyExc_ValueError});
  e.not_found = add_exception(m, "ZerowaitNotFoundError", "A path or key that does not exist.",
                              {e.base, PyExc_FileNotFoundError});
  e.already_exists =
      add_exception(m, "AlreadyExistsError", "Refusing to overwrite something that exists.",
                    {e.base, PyExc_FileExistsError});
  e.io = add_exception(m, "ZerowaitIOError",
                       "The operating system failed a call; the message names the path, the "
                       "offset and the OS error.",
                       {e.base, PyExc_OSError});
  e.corrupt = add_exception(m, "CorruptDataError",
                            "Bytes on disk do not match the format or their checksum; the message "
                            "names the shard (and the sample, when one is at fault).",
                            {e.base, PyExc_ValueError});
  e.unsupported = add_exception(m, "UnsupportedError",
                                "A valid but unknown format version or feature.", {e.base});
  e.deadline_exceeded =
      add_exception(m, "DeadlineExceededError", "A read did not finish before its deadline.",
                    {e.base, PyExc_TimeoutError});
  e.cancelled = add_exception(m, "CancelledError", "Work stopped on request.", {e.base});
  e.resource_exhausted = add_exception(
      m, "ResourceExhaustedError",
      "A memory budget or pool cannot hold what is asked; the message says how much was needed.",
      {e.base, PyExc_MemoryError});
  e.internal = add_exception(m, "InternalError", "A bug in zerowait; please report it.",
                             {e.base, PyExc_RuntimeError});

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& error) {
      const Status& status = error.status();
      PyObject* type = g_exceptions.for_code(status.code());
      // Same text as the C++ Status message, so Python and CLI errors read alike.
      try {
        py::object exc = py::handle(type)(fs_str(status.message()));
        exc.attr("code") = error_code_name(status.code());
        PyErr_SetObject(type, exc.ptr());
      } catch (py::error_already_set& e) {
        e.restore();  // building the exception failed: raise that failure instead
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Dataset

// What the Python `Dataset` holds: the shared C++ dataset plus the options it was opened with.
// Immutable after construction, so concurrent Python threads may read through one instance.
struct PyDataset {
  std::shared_ptr<Dataset> dataset;
  std::string path;  // as given, file system bytes
  IoBackend backend = IoBackend::kPread;
  ReadOptions read_options;
  std::string cache_dir;  // the cache's directory; empty: no cache
  uint64_t cache_bytes = 0;
};

std::shared_ptr<PyDataset> open_dataset(py::handle path, const std::string& io, bool verify,
                                        py::handle cache_dir, uint64_t cache_bytes) {
  auto handle = std::make_shared<PyDataset>();
  handle->path = fs_path(path);
  handle->backend = value_or_throw(parse_io_backend(io));
  handle->read_options.verify = verify;
  const CacheChoice choice = cache_choice(cache_dir);
  handle->cache_bytes = cache_bytes;
  handle->dataset = value_or_throw(without_gil([&]() -> Result<std::shared_ptr<Dataset>> {
    DatasetOptions options;
    options.backend = handle->backend;
    ZW_ASSIGN_OR_RETURN(options.cache,
                        open_block_cache_or_none(choice, handle->cache_bytes, handle->path));
    if (options.cache != nullptr && choice.directory.empty()) {
      // The default cache: what it is, so that a Loader or a pickled copy reads through it too.
      handle->cache_dir = options.cache->options().directory;
      handle->cache_bytes = options.cache->options().capacity_bytes;
    } else {
      handle->cache_dir = choice.directory;
    }
    return Dataset::open(handle->path, options);
  }));
  return handle;
}

}  // namespace

CacheChoice cache_choice(py::handle cache_dir) {
  CacheChoice choice;
  if (cache_dir.is_none()) return choice;
  if (py::isinstance<py::bool_>(cache_dir)) {
    if (cache_dir.cast<bool>()) {
      throw py::value_error("cache_dir=True: give a directory, None (the default cache) or False");
    }
    choice.off = true;
    return choice;
  }
  choice.directory = fs_path(cache_dir);
  throw_if_error(require_local_path(choice.directory, "cache_dir"));
  return choice;
}

Result<std::shared_ptr<BlockCache>> open_block_cache_or_none(const CacheChoice& choice,
                                                             uint64_t capacity_bytes,
                                                             const std::string& dataset_path) {
  if (choice.off) return std::shared_ptr<BlockCache>();
  if (choice.directory.empty()) return open_default_block_cache(dataset_path, capacity_bytes);
  BlockCacheOptions cache;
  cache.directory = choice.directory;
  cache.capacity_bytes = capacity_bytes;
  return BlockCache::open(std::move(cache));
}

namespace {

// Negative indices count from the end, like a list; anything else out of range is IndexError.
uint64_t normalize_index(const PyDataset& d, int64_t i) {
  const uint64_t n = d.dataset->size();
  const int64_t resolved = i < 0 ? i + static_cast<int64_t>(n) : i;
  if (resolved < 0 || static_cast<uint64_t>(resolved) >= n) {
    throw py::index_error("dataset index " + std::to_string(i) + " out of range (" +
                          std::to_string(n) + " samples)");
  }
  return static_cast<uint64_t>(resolved);
}

py::object cache_dir_or_none(const PyDataset& d) {
  return d.cache_dir.empty() ? py::object(py::none()) : py::object(fs_str(d.cache_dir));
}

std::shared_ptr<ShardReader> shard_reader(const PyDataset& d, size_t shard) {
  return value_or_throw(without_gil([&] { return d.dataset->shard(shard); }));
}

py::dict get_sample(const PyDataset& d, int64_t i) {
  const uint64_t index = normalize_index(d, i);
  const Sample sample =
      value_or_throw(without_gil([&] { return d.dataset->read(index, d.read_options); }));
  py::dict fields;
  for (const FieldView& field : sample.view.fields) {
    fields[fs_str(field.name)] =
        py::bytes(reinterpret_cast<const char*>(field.bytes.data()), field.bytes.size());
  }
  return fields;
}

py::str get_key(const PyDataset& d, int64_t i) {
  const uint64_t index = normalize_index(d, i);
  const SampleLocation location = value_or_throw(d.dataset->locate(index));
  return fs_str(shard_reader(d, location.shard)->key(location.local));
}

py::list get_shards(const PyDataset& d) {
  const Manifest& manifest = d.dataset->manifest();
  py::list shards;
  for (size_t s = 0; s < d.dataset->shard_count(); ++s) {
    py::dict shard;
    shard["path"] = fs_str(d.dataset->shard_path(s));
    if (s < manifest.shards.size()) {
      shard["samples"] = manifest.shards[s].samples;
      shard["bytes"] = manifest.shards[s].bytes;
    }
    shards.append(std::move(shard));
  }
  return shards;
}

struct BadSampleRecord {
  size_t shard = 0;
  uint64_t global_index = 0;
  BadSample bad;
};

// Checks every sample's checksum, shard by shard. A shard that cannot be read at all raises (its
// error names it); bad samples are returned.
py::list verify_dataset(const PyDataset& d) {
  std::vector<BadSampleRecord> found;
  Status failure;
  {
    py::gil_scoped_release release;
    uint64_t first_index = 0;
    for (size_t s = 0; s < d.dataset->shard_count() && failure.is_ok(); ++s) {
      Result<std::shared_ptr<ShardReader>> reader = d.dataset->shard(s);
      if (!reader.is_ok()) {
        failure = reader.status();
        break;
      }
      Result<uint64_t> checked = (*reader)->verify([&](const BadSample& bad) {
        found.push_back({s, first_index + bad.index, bad});
      });
      if (!checked.is_ok()) failure = checked.status();
      first_index += (*reader)->size();
    }
  }
  throw_if_error(failure);
  py::list out;
  for (const BadSampleRecord& record : found) {
    py::dict bad;
    bad["shard"] = fs_str(d.dataset->shard_path(record.shard));
    bad["index"] = record.global_index;
    bad["shard_index"] = record.bad.index;
    bad["key"] = fs_str(record.bad.key);
    bad["reason"] = record.bad.reason;
    out.append(std::move(bad));
  }
  return out;
}

void bind_dataset(py::module_& m) {
  py::class_<PyDataset, std::shared_ptr<PyDataset>>(m, "Dataset", R"doc(
Samples of a packed dataset, by global index.

``path`` is a manifest.json, a directory holding one, a directory of .zws / .tar shards, a single
.zws shard, or a single WebDataset .tar (its index is built once and cached beside it as
``<tar>.zwidx``), or an ``s3://`` / ``http(s)://`` URL of any of these. ``io`` picks the read
backend: "pread" or "mmap". With ``verify=True`` every read checks the sample's xxHash3 checksum
and raises CorruptDataError naming shard, index and key. Remote shards are read through a
node-local block cache, shared with every process and Loader that uses the same directory: by
default the one in ``zerowait.default_cache_dir()``, capped at a tenth of its file system and at
most 64 GiB (``cache_bytes`` caps it otherwise); ``cache_dir`` names another directory
(``cache_bytes``: 0 = half the free space), ``cache_dir=False`` reads without a cache. Local
files are never cached.

``ds[i]`` returns ``{field: bytes}`` (negative ``i`` counts from the end; IndexError past it).
Thread-safe: reads release the GIL and may run from several Python threads at once.
)doc")
      .def(py::init(&open_dataset), py::arg("path"), py::arg("io") = "pread",
           py::arg("verify") = false, py::arg("cache_dir") = py::none(),
           py::arg("cache_bytes") = 0)
      .def("__len__", [](const PyDataset& d) { return d.dataset->size(); })
      .def("__getitem__", &get_sample, py::arg("index"),
           "Returns the fields of sample `index` as {name: bytes}.")
      .def("key", &get_key, py::arg("index"),
           "Returns the key of sample `index` (its path without extension when packed from "
           "files).")
      .def("verify", &verify_dataset,
           "Checks every sample's checksum. Returns the bad samples as dicts with shard (path), "
           "index (global, as ds[index]), shard_index, key and reason; an empty list means the "
           "dataset is intact. Raises when a shard cannot be read at all.")
      .def_property_readonly("path", [](const PyDataset& d) { return fs_str(d.path); })
      .def_property_readonly("io", [](const PyDataset& d) { return io_backend_name(d.backend); })
      .def_property_readonly(
          "cache_dir", &cache_dir_or_none,
          "The node-local cache its remote shards are read through, or None.")
      .def_property_readonly(
          "cache_bytes", [](const PyDataset& d) { return d.cache_bytes; },
          "The cache's cap in bytes (0: half the free space when opened).")
      .def_property_readonly(
          "fields", [](const PyDataset& d) { return str_list(d.dataset->fields()); },
          "Every field name that occurs, sorted.")
      .def_property_readonly(
          "classes", [](const PyDataset& d) { return str_list(d.dataset->classes()); },
          "ImageFolder class names; a sample's 'cls' field (ASCII decimal) "
          "indexes this list. Empty for other datasets.")
      .def_property_readonly("shard_count",
                             [](const PyDataset& d) { return d.dataset->shard_count(); })
      .def_property_readonly("shards", &get_shards,
                             "One dict per shard: path, samples, bytes (file size).")
      .def("__repr__",
           [](const PyDataset& d) {
             return py::str("zerowait.Dataset({!r}, samples={}, shards={}, io={!r})")
                 .format(fs_str(d.path), d.dataset->size(), d.dataset->shard_count(),
                         io_backend_name(d.backend));
           })
      // Picklable by path, so a Dataset can travel to spawned DataLoader workers.
      .def(py::pickle(
          [](const PyDataset& d) {
            return py::make_tuple(fs_str(d.path), io_backend_name(d.backend), d.read_options.verify,
                                  // No cache stays no cache (None would take the default).
                                  d.cache_dir.empty() ? py::object(py::bool_(false))
                                                      : py::object(fs_str(d.cache_dir)),
                                  d.cache_bytes);
          },
          [](const py::tuple& state) {
            if (state.size() != 5) throw py::value_error("invalid zerowait.Dataset state");
            return open_dataset(state[0], state[1].cast<std::string>(), state[2].cast<bool>(),
                                state[3], state[4].cast<uint64_t>());
          }));
}

// ---------------------------------------------------------------------------------------------
// pack

// Hands pack's progress (reported from its writer thread) to a Python callable. The callable is
// only touched with the GIL held; the first exception it raises stops further calls and is
// re-raised once pack returns.
struct ProgressRelay {
  py::object callback;
  std::exception_ptr error;

  void operator()(const PackProgress& p) {
    py::gil_scoped_acquire gil;
    if (error) return;
    try {
      py::dict info;
      info["files_done"] = p.files_done;
      info["files_total"] = p.files_total;
      info["bytes_done"] = p.bytes_done;
      info["bytes_total"] = p.bytes_total;
      callback(info);
    } catch (...) {
      error = std::current_exception();
    }
  }
};

// `part`: None, "I/N", or (I, N).
void set_pack_part(py::handle part, PackOptions* options) {
  if (part.is_none()) return;
  if (py::isinstance<py::str>(part)) {
    throw_if_error(
        parse_pack_part(part.cast<std::string>(), &options->part_index, &options->part_count));
    return;
  }
  if (!py::isinstance<py::sequence>(part) || py::len(part) != 2) {
    throw py::type_error("part must be \"I/N\" or a pair (I, N)");
  }
  const py::sequence pair = py::reinterpret_borrow<py::sequence>(part);
  const std::string text = py::str(pair[0]).cast<std::string>() + "/" +
                           py::str(pair[1]).cast<std::string>();
  throw_if_error(parse_pack_part(text, &options->part_index, &options->part_count));
}

py::dict pack_py(py::handle sources, py::handle out_dir, bool imagefolder, uint64_t shard_size,
                 unsigned threads, bool align, bool verify_images, bool overwrite, bool sync,
                 py::handle part, py::handle tmp_dir, py::object progress) {
  PackOptions options;
  if (is_path_like(sources)) {
    options.sources.push_back(fs_path(sources));
  } else {
    for (py::handle source : sources) options.sources.push_back(fs_path(source));
  }
  options.out_dir = fs_path(out_dir);
  options.imagefolder = imagefolder;
  options.shard_size = shard_size;
  options.threads = threads;
  options.align = align;
  options.verify_images = verify_images;
  options.overwrite = overwrite;
  options.sync = sync;
  set_pack_part(part, &options);
  if (!tmp_dir.is_none()) options.tmp_dir = fs_path(tmp_dir);
  throw_if_error(require_local_path(options.tmp_dir, "tmp_dir"));

  ProgressRelay relay;
  if (!progress.is_none()) {
    if (!PyCallable_Check(progress.ptr())) throw py::type_error("progress must be callable");
    relay.callback = std::move(progress);
    // Capture a pointer, not the py::object: pack may copy the std::function on threads that do
    // not hold the GIL, and copying a py::object touches its reference count.
    options.on_progress = [relay_ptr = &relay](const PackProgress& p) { (*relay_ptr)(p); };
  }

  Result<PackReport> packed = without_gil([&] { return pack(options); });
  if (relay.error) std::rethrow_exception(relay.error);
  const PackReport report = value_or_throw(std::move(packed));

  py::list quarantined;
  for (const QuarantineEntry& entry : report.quarantined) {
    py::dict q;
    q["path"] = fs_str(entry.path);
    q["reason"] = entry.reason;
    quarantined.append(std::move(q));
  }
  py::dict out = written_dataset_report(report, std::move(quarantined));
  out["files"] = report.files;
  out["ignored"] = report.ignored;
  return out;
}

py::dict generate_imagefolder_py(py::handle out_dir, uint64_t files, uint32_t classes,
                                 uint64_t seed, uint64_t min_bytes, uint64_t max_bytes,
                                 unsigned threads) {
  SyntheticImageFolderOptions options;
  options.out_dir = fs_path(out_dir);
  throw_if_error(require_local_path(options.out_dir, "out_dir"));
  options.files = files;
  options.classes = classes;
  options.seed = seed;
  options.min_bytes = min_bytes;
  options.max_bytes = max_bytes;
  options.threads = threads;
  const SyntheticReport report =
      value_or_throw(without_gil([&] { return generate_imagefolder(options); }));
  py::dict out;
  out["files"] = report.files;
  out["bytes"] = report.bytes;
  return out;
}

py::dict merge_py(py::handle out_dir, py::object parts, bool overwrite, bool sync,
                  bool whole_datasets) {
  MergeOptions options;
  options.out_dir = fs_path(out_dir);
  if (!parts.is_none()) {
    for (py::handle part : parts) options.parts.push_back(fs_path(part));
  }
  options.overwrite = overwrite;
  options.sync = sync;
  options.whole_datasets = whole_datasets;
  const MergeReport report = value_or_throw(without_gil([&] { return merge_parts(options); }));
  py::list merged_parts;
  for (const MergedPart& p : report.parts) {
    py::dict part;
    part["index"] = p.index;
    part["dir"] = fs_str(p.dir);
    part["samples"] = p.samples;
    part["shards"] = p.shards;
    part["bytes"] = p.bytes;
    merged_parts.append(std::move(part));
  }
  py::dict out;
  out["manifest_path"] = fs_str(report.manifest_path);
  out["part_count"] = report.part_count;
  out["samples"] = report.samples;
  out["shards"] = report.shards;
  out["bytes"] = report.bytes;
  out["seconds"] = report.seconds;
  out["parts"] = std::move(merged_parts);
  return out;
}

void bind_functions(py::module_& m) {
  // Defaults come from the C++ option structs: one source of truth.
  const PackOptions pack_defaults;
  m.def(
      "default_cache_dir",
      [] { return fs_str(value_or_throw(default_cache_directory(kBlockCacheSubdirectory))); },
      R"(The directory a cache of remote data takes when you name none:
``$ZEROWAIT_CACHE_DIR/blocks``, else ``$XDG_CACHE_HOME/zerowait/blocks``, else
``~/.cache/zerowait/blocks``. Yours, writable without root; not created until used. A remote
Dataset or Loader opened without ``cache_dir=`` reads through it (docs/cache.md, "Where caches
live").)");
  m.def(
      "require_local_path",
      [](py::handle path, const std::string& what, const std::string& fix) {
        throw_if_error(require_local_path(fs_path(path), what, fix));
      },
      py::arg("path"), py::arg("what"), py::arg("fix") = "",
      R"(Raises InvalidArgumentError (a ValueError) in one line when ``path`` is a URL
("s3://...", "https://...") where only a local path works; returns None otherwise.)");
  m.def("pack", &pack_py, py::arg("sources"), py::arg("out_dir"), py::kw_only(),
        py::arg("imagefolder") = pack_defaults.imagefolder,
        py::arg("shard_size") = pack_defaults.shard_size,
        py::arg("threads") = pack_defaults.threads, py::arg("align") = pack_defaults.align,
        py::arg("verify_images") = pack_defaults.verify_images,
        py::arg("overwrite") = pack_defaults.overwrite, py::arg("sync") = pack_defaults.sync,
        py::arg("part") = py::none(), py::arg("tmp_dir") = py::none(),
        py::arg("progress") = py::none(), R"doc(
Packs trees of small files, ImageFolder trees and WebDataset tars into shards plus a manifest,
like ``zerowait pack``. ``out_dir`` is a directory or ``s3://BUCKET/PREFIX`` (shards go up as
they are finished, spooled one at a time in ``tmp_dir``, default $TMPDIR).

``part="I/N"`` or ``part=(I, N)`` packs the I-th of N parts into ``out_dir/part-IIII-of-NNNN``,
as ``pack --part I/N`` does on each of N machines; :func:`merge` then joins them.

``sources`` is one path or a list of paths (directories, .tar, .tar.gz). With
``imagefolder=True`` CLASS/FILE.ext becomes fields ``ext`` and ``cls`` (ASCII decimal index into
the sorted class names). ``threads=0`` uses every CPU. ``progress``, when given, is called with
a dict (files_done, files_total, bytes_done, bytes_total) from a pack thread while holding the
GIL; an exception it raises is re-raised after pack finishes. Corrupt inputs are quarantined,
not packed, and listed in the report.

Returns a dict: samples, files, ignored, shards, bytes_in, bytes_out, seconds,
quarantined ([{path, reason}]), manifest_path. Same inputs and options give identical bytes.
)doc");

  const MergeOptions merge_defaults;
  m.def("merge", &merge_py, py::arg("out_dir"), py::arg("parts") = py::none(), py::kw_only(),
        py::arg("overwrite") = merge_defaults.overwrite, py::arg("sync") = merge_defaults.sync,
        py::arg("whole_datasets") = merge_defaults.whole_datasets, R"doc(
Joins the parts that ``pack(..., part=(I, N))`` wrote into ``out_dir`` (a directory or
``s3://BUCKET/PREFIX``) into one dataset, ``out_dir/manifest.json``, without copying a shard,
like ``zerowait merge``. ``parts``: the part directories (default: every part-IIII-of-NNNN in
``out_dir``). Refuses, naming the part and the fix, a missing or duplicated part, parts of
different inputs or options, a damaged shard and a key in two parts. ``whole_datasets=True``
joins the datasets ``parts`` names (each written on its own, as ``zerowait.ray.write_dataset``'s
tasks write them) in the order given; they carry no part record, so no fingerprint is compared.

Returns a dict: manifest_path, part_count, samples, shards, bytes, seconds, and parts
([{index, dir, samples, shards, bytes}]).
)doc");

  const SyntheticImageFolderOptions gen_defaults;
  m.def("generate_imagefolder", &generate_imagefolder_py, py::arg("out_dir"), py::kw_only(),
        py::arg("files") = gen_defaults.files, py::arg("classes") = gen_defaults.classes,
        py::arg("seed") = gen_defaults.seed, py::arg("min_bytes") = gen_defaults.min_bytes,
        py::arg("max_bytes") = gen_defaults.max_bytes, py::arg("threads") = gen_defaults.threads,
        R"doc(
Writes a synthetic ImageFolder tree of real, decodable JPEGs:
``out_dir/class_XXX/img_XXXXXXXX.jpg``, each between min_bytes and max_bytes. The same options
give the same bytes. Returns a dict: files, bytes.
)doc");
}

}  // namespace
}  // namespace zerowait

PYBIND11_MODULE(_core, m) {
  m.doc() = "zerowait's C++ core. Use the `zerowait` package rather than this module directly.";
  m.attr("__version__") = ZEROWAIT_VERSION;
  zerowait::register_exceptions(m);
  zerowait::bind_dataset(m);
  zerowait::bind_functions(m);
  zerowait::bind_loader(m);
  zerowait::bind_checkpoint(m);
  zerowait::bind_state_walk(m);
  zerowait::bind_writer(m);
  zerowait::bind_observe(m);
  zerowait::bind_gds(m);
}
