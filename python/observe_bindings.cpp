// zerowait._core's observe functions: the money a run's waits cost, the comparison of two runs,
// and the system sampler (docs/observe.md). The JSON objects come from the same code that writes
// run.json and system.jsonl (src/observe/run/run_json.cpp), so Python sees the same fields.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common.hpp"
#include "host/memory_headroom.hpp"
#include "observe/run/run_directory.hpp"
#include "observe/run/run_json.hpp"
#include "zerowait/host/page_cache.hpp"
#include "zerowait/observe/attribution.hpp"
#include "zerowait/observe/causes.hpp"
#include "zerowait/observe/cost.hpp"
#include "zerowait/observe/system_sampler.hpp"

namespace zerowait {
namespace {

using observe::SystemSample;
using observe::SystemSampler;
using observe::SystemSamplerOptions;

py::object json_to_py(const nlohmann::ordered_json& value) {
  return py::module_::import("json").attr("loads")(value.dump());
}

nlohmann::json py_to_json(const py::handle& value, const char* name) {
  if (!py::isinstance<py::dict>(value)) {
    throw py::type_error(std::string(name) + " must be a dict (a run.json object)");
  }
  const std::string text = py::module_::import("json").attr("dumps")(value).cast<std::string>();
  return nlohmann::json::parse(text);
}

// A JSON value of Python's (dicts keep their order). NaN and infinities are refused (ValueError):
// JSON has no spelling for them, and no reader of a run directory would take them.
nlohmann::ordered_json py_to_ordered_json(const py::handle& value) {
  py::dict options;
  options["allow_nan"] = false;
  const std::string text =
      py::module_::import("json").attr("dumps")(value, **options).cast<std::string>();
  return nlohmann::ordered_json::parse(text);
}

void write_run_py(const py::object& dir, const py::dict& run, const py::dict& files) {
  if (!py::isinstance<py::dict>(run)) throw py::type_error("run must be a dict (run.json)");
  const nlohmann::ordered_json document = py_to_ordered_json(run);
  std::vector<observe::RunFile> run_files;
  for (const auto& [name, objects] : files) {
    const nlohmann::ordered_json list = py_to_ordered_json(objects);
    if (!list.is_array()) throw py::type_error("files' values must be lists of dicts");
    run_files.push_back({py::str(name).cast<std::string>(),
                         observe::json_lines(list.get<std::vector<nlohmann::ordered_json>>())});
  }
  const std::string path = fs_path(dir);
  throw_if_error(without_gil([&] { return observe::write_run_directory(path, document, run_files); }));
}

void require_gpus(int64_t gpus) {
  if (gpus < 1) {
    throw_if_error(invalid_argument("gpus = " + std::to_string(gpus) + ": give at least 1 GPU"));
  }
}

py::object wait_cost_py(const py::dict& shares, int64_t gpus, double gpu_hourly_cost) {
  std::map<std::string, double> values;
  for (const auto& item : shares) {
    const std::string cause = py::str(item.first).cast<std::string>();
    if (!py::isinstance<py::float_>(item.second) && !py::isinstance<py::int_>(item.second)) {
      throw py::type_error("shares['" + cause + "'] must be a number, got " +
                           py::repr(item.second).cast<std::string>());
    }
    values[cause] = item.second.cast<double>();
  }
  return json_to_py(observe::cost_json(
      value_or_throw(observe::wait_cost(values, gpus, gpu_hourly_cost))));
}

py::object compare_runs_py(const py::dict& before, const py::dict& after, int64_t gpus,
                           double gpu_hourly_cost, const py::object& before_path) {
  require_gpus(gpus);
  const observe::RunFigures before_figures =
      value_or_throw(observe::run_figures(py_to_json(before, "before"), "before"));
  const observe::RunFigures after_figures =
      value_or_throw(observe::run_figures(py_to_json(after, "after"), "after"));
  std::string name;
  if (!before_path.is_none()) {
    name = fs_path(before_path);
  } else if (before.contains("title") && py::isinstance<py::str>(before["title"])) {
    name = before["title"].cast<std::string>();
  }
  return json_to_py(observe::comparison_json(value_or_throw(
      observe::compare_runs(before_figures, after_figures, name, gpus, gpu_hourly_cost))));
}

std::unique_ptr<SystemSampler> make_sampler(int64_t pid, double interval,
                                            const py::object& root, int64_t max_samples) {
  if (pid < 0) {
    throw_if_error(invalid_argument("pid = " + std::to_string(pid) +
                                    ": give a process id, or 0 for this process"));
  }
  SystemSamplerOptions options;
  options.pid = static_cast<pid_t>(pid);
  options.interval = interval;
  options.max_samples = static_cast<size_t>(std::max<int64_t>(max_samples, 0));
  options.root = root.is_none() ? "" : fs_path(root);
  throw_if_error(options.validate());  // here, not at start(): the constructor names the mistake
  return std::make_unique<SystemSampler>(std::move(options));
}

py::list samples_py(const SystemSampler& sampler) {
  const std::vector<SystemSample> samples = sampler.samples();
  py::list out;
  const py::object loads = py::module_::import("json").attr("loads");
  for (const SystemSample& s : samples) out.append(loads(observe::to_json(s)));
  return out;
}

}  // namespace

void bind_observe(py::module_& m) {
  m.attr("RUN_SCHEMA") = observe::kRunSchema;  // run.json's "schema" (docs/observe.md)
  py::tuple causes(observe::kCauses.size());
  for (size_t i = 0; i < observe::kCauses.size(); ++i) causes[i] = observe::kCauses[i];
  m.attr("CAUSES") = causes;  // run.json's causes, in the order it lists them
  m.def(
      "cause_summary",
      [](const std::map<std::string, double>& seconds, double wall_s,
         std::optional<int> decimals) {
        return json_to_py(
            value_or_throw(observe::cause_summary(seconds, wall_s, decimals.value_or(-1))));
      },
      py::arg("seconds"), py::arg("wall_s"), py::arg("decimals") = py::none(), R"doc(
run.json's causes, seconds, shares and verdict from each cause's seconds over ``wall_s``: the
causes given, in CAUSES's order; share = seconds / wall_s (0 when wall_s is 0); the verdict of
verdict_of ("unknown" when wall_s is 0). ``decimals`` rounds the seconds and shares written. The
one summary of every producer (watch, profile, emulate); ValueError for an unknown cause.
)doc");
  m.def("write_run", &write_run_py, py::arg("dir"), py::arg("run"), py::arg("files"), R"doc(
Writes a run directory (docs/observe.md), the one writer of every producer: each of ``files``
({"steps.jsonl": [dict, ...], ...}, names relative to ``dir``) as JSON Lines, then run.json
(``run``, indented) last, each file written whole and renamed, folders created. ValueError when
``run`` breaks the schema (schema, kind, causes) or holds NaN; OSError when a file cannot be
written.
)doc");
  // The machine as the C++ tools read it (host/), for emulate and bench net: one reader each.
  m.def(
      "evict_from_page_cache",
      [](const std::vector<std::string>& paths) {
        throw_if_error(without_gil([&] { return evict_from_page_cache(paths); }));
      },
      py::arg("paths"), R"doc(
Drops the files' pages from the page cache (fdatasync, then posix_fadvise(POSIX_FADV_DONTNEED)):
what `zerowait bench files` and `zerowait emulate` do before a cold pass. No root needed.
)doc");
  m.def(
      "page_cache_residency",
      [](const std::vector<std::string>& paths) {
        const Residency r = value_or_throw(without_gil([&] { return residency(paths); }));
        py::dict d;
        d["bytes"] = r.bytes;
        d["resident_bytes"] = r.resident_bytes;
        d["unmeasured_bytes"] = r.unmeasured_bytes;
        d["unmeasured_reason"] = r.unmeasured_bytes != 0 ? kUnmeasuredResidency : "";
        return d;
      },
      py::arg("paths"), R"doc(
How much of the files is in the page cache now (mincore): {"bytes", "resident_bytes",
"unmeasured_bytes" (files this user cannot measure), "unmeasured_reason"}. What `zerowait
emulate` measures before each run. OSError naming a file that cannot be opened.
)doc");
  m.def(
      "available_memory_bytes", [] { return available_memory_bytes(); },
      "MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.");
  m.def(
      "verdict_of",
      [](const std::map<std::string, double>& shares) { return observe::verdict_of(shares); },
      py::arg("shares"), R"doc(
What bounds a run, from its shares of wall time by cause: "<cause>-bound" for the largest of
input, checkpoint, h2d and communication when it is >= 0.25, else "compute-bound" when compute
is >= 0.6, else "unknown". The rule of every producer (docs/observe.md).
)doc");
  m.def("wait_cost", &wait_cost_py, py::arg("shares"), py::arg("gpus"),
        py::arg("gpu_hourly_cost"), R"doc(
What each cause's share of wall time costs on ``gpus`` GPUs at ``gpu_hourly_cost`` per GPU-hour:
the ``cost`` object of run.json (docs/observe.md). ``per_day[cause]`` = share x gpus x rate x 24,
``per_year`` x 365; ``wait_per_day``/``wait_per_year`` sum every cause but "compute".
Raises ValueError (InvalidArgumentError) naming the field: gpus < 1, a negative cost, a share
outside [0, 1].
)doc");
  m.def("compare_runs", &compare_runs_py, py::arg("before"), py::arg("after"), py::arg("gpus"),
        py::arg("gpu_hourly_cost"), py::kw_only(), py::arg("before_path") = py::none(), R"doc(
The ``comparison`` object of run.json: how much less GPU time the same work takes in ``after``
than in ``before`` (both run.json objects). saving_share = 1 - before/after
throughput.samples_per_s when both have it, else 1 - before/after shares.compute; negative is a
regression. saving_per_day/per_year price it on ``gpus`` at ``gpu_hourly_cost``. ``before``
in the result is ``before_path`` (default: the before run's title). Raises ValueError naming the
field when neither rule applies or an argument is out of range.
)doc");

  py::class_<SystemSampler>(m, "SystemSampler", R"doc(
Samples the machine and a process tree every ``interval`` seconds on a C++ thread: CPU, memory,
swap, the tree's storage I/O, each whole disk's busy share, queue and latency, the tree's threads
by state, and GPU utilisation through NVML when present. ``pid`` 0 is this process; ``root``
reads /proc and /sys under a fixture directory. ``samples()`` returns system.jsonl objects
(docs/observe.md); the first reading only sets baselines, so a sample needs two readings. At
``max_samples`` neighbours are merged two by two and the interval doubles (``current_interval``),
so a sampler beside a job of days stays small.

    with zerowait._core.SystemSampler(interval=0.05) as sampler:
        train()
    rows = sampler.samples()
)doc")
      .def(py::init(&make_sampler), py::arg("pid") = 0, py::arg("interval") = 0.1,
           py::arg("root") = "", py::arg("max_samples") = 20000)
      .def("start",
           [](SystemSampler& s) { throw_if_error(without_gil([&] { return s.start(); })); },
           "Starts sampling. Raises when already started.")
      .def("stop", [](SystemSampler& s) { without_gil([&] { s.stop(); }); },
           "Takes a last reading and stops; a no-op when not running.")
      .def("samples", &samples_py, "Every sample so far, as system.jsonl dicts, in order.")
      .def_property_readonly("running", &SystemSampler::running)
      .def_property_readonly("pid", [](const SystemSampler& s) { return s.options().pid; })
      .def_property_readonly("interval",
                             [](const SystemSampler& s) { return s.options().interval; })
      .def_property_readonly("current_interval", &SystemSampler::current_interval)
      .def("__enter__",
           [](SystemSampler& s) -> SystemSampler& {
             throw_if_error(without_gil([&] { return s.start(); }));
             return s;
           },
           py::return_value_policy::reference)
      .def("__exit__", [](SystemSampler& s, const py::args&) { without_gil([&] { s.stop(); }); });
}

}  // namespace zerowait
