"""The loader's, the checkpointer's and the step profiler's counters as Prometheus metrics.

``render()`` writes the text exposition format 0.0.4; ``write_textfile()`` feeds node_exporter's
textfile collector; ``serve()`` answers scrapes on ``/metrics`` itself. Every scrape renders
fresh from the objects' counters, so nothing here keeps state. docs/metrics.md lists the metrics.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterable, List, Tuple

from zerowait._paths import local_path

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (stats key, metric name, help) of Loader.stats() totals, and of its pool state.
_LOADER_COUNTERS = (
    ("batches", "zerowait_loader_batches_total", "Batches the loader has produced."),
    ("samples", "zerowait_loader_samples_total", "Samples the loader has produced."),
    ("bytes_read", "zerowait_loader_read_bytes_total", "Bytes the loader has read from storage."),
    ("wait_s", "zerowait_loader_wait_seconds_total",
     "Seconds the training loop was blocked in next() on the C++ stages."),
    ("read_s", "zerowait_loader_read_seconds_total", "Seconds the loader's threads spent reading."),
    ("decode_s", "zerowait_loader_decode_seconds_total",
     "Seconds the loader's threads spent decoding and augmenting."),
    ("skipped", "zerowait_loader_skipped_samples_total", "Corrupt samples skipped."),
    ("io_fallbacks", "zerowait_loader_io_fallbacks_total",
     "Reads that fell back from the requested I/O engine."),
)
_LOADER_GAUGES = (
    ("threads", "zerowait_loader_threads", "Loader worker threads."),
    ("prefetch", "zerowait_loader_prefetch_batches", "Batches the loader prepares ahead."),
    ("arenas", "zerowait_loader_arenas", "Batch arenas in the pool."),
    ("arenas_free", "zerowait_loader_arenas_free", "Batch arenas free now."),
    ("arena_bytes", "zerowait_loader_arena_bytes", "Bytes held by the batch arenas."),
    ("memory_budget", "zerowait_loader_memory_budget_bytes", "The loader's memory budget."),
)
_MAP_COUNTERS = (
    ("wait_s", "zerowait_loader_map_wait_seconds_total",
     "Seconds next() waited on the map= function's results."),
    ("fn_s", "zerowait_loader_map_fn_seconds_total",
     "Seconds spent in the map= function, all workers."),
    ("errors", "zerowait_loader_map_errors_total", "Samples whose map= function raised."),
    ("worker_deaths", "zerowait_loader_map_worker_deaths_total", "Map workers that died."),
)
_CACHE_COUNTERS = (
    ("hits", "zerowait_cache_hits_total", "Block reads served from the local cache."),
    ("misses", "zerowait_cache_misses_total", "Blocks this process downloaded."),
    ("evictions", "zerowait_cache_evictions_total", "Blocks evicted from the cache."),
    ("bytes_hit", "zerowait_cache_hit_bytes_total", "Bytes served from the local cache."),
    ("bytes_downloaded", "zerowait_cache_downloaded_bytes_total", "Bytes downloaded."),
)
_CACHE_GAUGES = (
    ("usage_bytes", "zerowait_cache_usage_bytes", "Bytes the cache holds (all processes)."),
    ("capacity_bytes", "zerowait_cache_capacity_bytes", "The cache's cap in bytes."),
)

Sample = Tuple[str, Dict[str, str], float]  # name with suffix, labels, value


class _Families:
    """Metric families in the order they were added, rendered as text format 0.0.4."""

    def __init__(self) -> None:
        self._families: List[Tuple[str, str, str, List[Sample]]] = []

    def add(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        self._families.append((name, kind, help_text, list(samples)))

    def simple(self, name: str, kind: str, help_text: str, value: Any) -> None:
        if value is not None:
            self.add(name, kind, help_text, [(name, {}, float(value))])

    def text(self) -> str:
        lines = []
        for name, kind, help_text, samples in self._families:
            escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
            lines += [f"# HELP {name} {escaped}", f"# TYPE {name} {kind}"]
            lines += [f"{sample}{_labels(labels)} {_number(value)}"
                      for sample, labels, value in samples]
        return "\n".join(lines) + "\n" if lines else ""


def _labels(labels: Dict[str, str]) -> str:
    if not labels:
        return ""
    quoted = (f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
              for k, v in labels.items())
    return "{" + ",".join(quoted) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))  # counts as counts: "8", not "8.0"
    return repr(float(value))


def _add_loader(families: _Families, loader: Any) -> None:
    stats = loader.stats()
    for key, name, help_text in _LOADER_COUNTERS:
        families.simple(name, "counter", help_text, stats.get(key))
    for key, name, help_text in _LOADER_GAUGES:
        families.simple(name, "gauge", help_text, stats.get(key))
    recent = stats.get("recent") or []
    if recent:
        families.simple("zerowait_loader_ready_batches", "gauge",
                        "Batches ready ahead of the training loop at the last next().",
                        recent[-1].get("ready_batches"))
    for key, name, help_text in _MAP_COUNTERS if stats.get("map") else ():
        families.simple(name, "counter", help_text, stats["map"].get(key))
    cache = stats.get("cache")
    if cache:
        for key, name, help_text in _CACHE_COUNTERS:
            families.simple(name, "counter", help_text, cache.get(key))
        for key, name, help_text in _CACHE_GAUGES:
            families.simple(name, "gauge", help_text, cache.get(key))


def _add_checkpointer(families: _Families, checkpointer: Any) -> None:
    families.simple("zerowait_checkpoint_saves_total", "counter",
                    "Checkpoint saves started.", checkpointer.saves)
    families.simple("zerowait_checkpoint_blocked_seconds_total", "counter",
                    "Seconds save() held the training loop.", checkpointer.blocked_s)
    families.simple("zerowait_checkpoint_last_committed_step", "gauge",
                    "The newest committed checkpoint step in the directory.",
                    checkpointer.latest())


def _histogram(name: str, snapshot: Dict[str, Any]) -> List[Sample]:
    samples: List[Sample] = [(f"{name}_bucket", {"le": _number(bound)}, float(count))
                             for bound, count in snapshot["buckets"]]
    return samples + [(f"{name}_sum", {}, snapshot["sum"]),
                      (f"{name}_count", {}, float(snapshot["count"]))]


def _add_profiler(families: _Families, profiler: Any) -> None:
    histograms = profiler.histograms()
    families.add("zerowait_step_seconds", "histogram",
                 "Wall time of training steps (start to the next step's start).",
                 _histogram("zerowait_step_seconds", histograms["step_seconds"]))
    families.add("zerowait_step_input_wait_seconds", "histogram",
                 "Input wait per training step.",
                 _histogram("zerowait_step_input_wait_seconds",
                            histograms["step_input_wait_seconds"]))
    families.add("zerowait_step_wait_seconds_total", "counter",
                 "Seconds of training steps spent waiting, by cause.",
                 [("zerowait_step_wait_seconds_total", {"cause": cause}, seconds)
                  for cause, seconds in histograms["seconds"].items() if cause != "compute"])


def render(loader: Any = None, checkpointer: Any = None, profiler: Any = None) -> str:
    """The metrics of the given sources in Prometheus text format 0.0.4 (docs/metrics.md);
    the profiler's loader and checkpointer are used when none is given."""
    loader = loader if loader is not None else getattr(profiler, "loader", None)
    checkpointer = (checkpointer if checkpointer is not None
                    else getattr(profiler, "checkpointer", None))
    families = _Families()
    if loader is not None:
        _add_loader(families, loader)
    if checkpointer is not None:
        _add_checkpointer(families, checkpointer)
    if profiler is not None:
        _add_profiler(families, profiler)
    return families.text()


def write_textfile(path: Any, **sources: Any) -> None:
    """Writes render(**sources) to ``path`` for node_exporter's textfile collector: to a
    temporary file in the same directory, then renamed over ``path``, so the collector never
    reads half a file. ``path`` must end in ``.prom`` (the collector reads nothing else)."""
    path = local_path(path, "path")
    if not path.endswith(".prom"):
        raise ValueError(f"{path}: node_exporter's textfile collector reads only *.prom files")
    text = render(**sources)
    directory, name = os.path.split(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide it from a collector user
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


class MetricsServer:
    """A running ``/metrics`` endpoint: :attr:`port`, :attr:`url`, :meth:`close`."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        host, self.port = server.server_address[:2]
        self.url = f"http://{host}:{self.port}/metrics"
        # A daemon so that a forgotten close() never keeps the job alive; close() joins it.
        self._thread = threading.Thread(target=server.serve_forever, name="zerowait-metrics",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops answering and frees the port. Idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
            self._server.server_close()

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve(port: int = 0, addr: str = "127.0.0.1", **sources: Any) -> MetricsServer:
    """Serves render(**sources), fresh at each scrape, on http://addr:port/metrics (port 0: a
    free one, see ``.port``) from a daemon thread; other paths are 404."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            try:
                body = render(**sources).encode()
            except Exception as error:  # noqa: BLE001 - the scraper gets the reason
                self.send_error(500, f"rendering the metrics failed: {error}")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # scrapes every 15 s would flood stderr
            pass

    return MetricsServer(ThreadingHTTPServer((addr, port), Handler))
