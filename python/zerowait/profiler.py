"""Where the seconds of a training step go, measured inside the loop: ``zerowait.StepProfiler``.

A step runs from one ``with prof.step():`` to the next, so the ``next(loader)`` between them is
part of it. Each step's wall time is split into the causes of docs/observe.md: ``input`` (the
zerowait Loader's wait, or a wrapped iterator's next()), ``checkpoint`` (the time
``Checkpointer.save`` held the loop), ``h2d`` (a ``Loader(device="cuda")``'s copies, timed on the
GPU, or ``prof.phase``), ``communication`` and ``other`` (``prof.phase``),
and ``compute``: what is left. ``save()`` writes the run directory that ``zerowait report``
draws; ``report()`` prints the same as a table with the money line.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

from zerowait import _core
from zerowait import _input_advice
from zerowait._paths import local_path
from zerowait.loader import Loader

SCHEMA = _core.RUN_SCHEMA  # "zerowait.run/1" (docs/observe.md)
CAUSES = _core.CAUSES  # run.json's causes, in its order (zerowait/observe/causes.hpp)
WAITS = tuple(c for c in CAUSES if c != "compute")
# Step-time histogram bounds (seconds), Prometheus style: from a fast step to a stalled one.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
           60.0, float("inf"))
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    """This process's resident set now: one read of /proc/self/statm, cheap enough per step."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def _loader_wait_s(loader: Any) -> float:
    """The loop's wait on a zerowait Loader (its cheap counter), or on anything else with a
    Loader-like stats()."""
    if isinstance(loader, Loader):
        return loader.wait_s
    stats = loader.stats()
    return stats["wait_s"] + (stats.get("map") or {}).get("wait_s", 0.0)


class _Histogram:
    """Cumulative buckets, sum and count of one per-step quantity."""

    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> Dict[str, Any]:
        return {"buckets": list(zip(BUCKETS, self.counts)), "sum": self.sum, "count": self.count}


class _Step:
    """A step being measured: where it started and the counters there."""

    def __init__(self, index: int, t: float, counters: Dict[str, float], rss: Optional[int],
                 samples: Optional[int], nbytes: Optional[int]) -> None:
        self.index = index
        self.t = t
        self.counters = counters
        self.rss = rss
        self.samples = samples
        self.bytes = nbytes
        self.phases = dict.fromkeys(WAITS, 0.0)
        self.ended: Optional[tuple] = None  # (t, counters) when its with-block exited


class StepProfiler:
    """Per-step attribution of a training loop's wall time to input, checkpoint, h2d,
    communication, compute and other (docs/observe.md, "StepProfiler").

    ``loader``: a :class:`zerowait.Loader` (its wait is the input time); ``checkpointer``: a
    :class:`zerowait.Checkpointer` (its :attr:`~zerowait.Checkpointer.blocked_s` is the
    checkpoint time). ``sample_system`` runs ``_core.SystemSampler`` on this process every
    ``interval`` seconds for system.jsonl and the swap flag. ``gpus`` and ``gpu_hourly_cost``
    price the waits. The resident set is read at every step boundary: it is flagged as a leak
    when, after the first ``leak_skip_steps`` steps, it grows in at least ``leak_share`` of the
    step-to-step deltas and by at least ``leak_min_bytes`` and ``leak_min_growth`` (a share).

    Memory stays bounded over a run of any length: at most ``max_rows`` rows of steps.jsonl
    are kept, and when they are full each two neighbours become one row (``steps`` says how
    many steps a row covers; its buckets are their sums), as the system sampler keeps at most
    ``max_samples``. Totals, shares and histograms count every step whatever the rows hold.

    Not thread-safe for the training side (call step()/phase() from one thread); the metrics
    endpoint may read :meth:`histograms` from another.
    """

    def __init__(self, loader: Any = None, checkpointer: Any = None, out: Any = None,
                 sample_system: bool = True, interval: float = 0.1, gpus: int = 1,
                 gpu_hourly_cost: Optional[float] = None, title: Optional[str] = None, *,
                 leak_skip_steps: int = 3, leak_share: float = 0.9,
                 leak_min_bytes: int = 64 << 20, leak_min_growth: float = 0.10,
                 max_rows: int = 10000, max_samples: int = 20000) -> None:
        if max_rows < 2:
            raise ValueError(f"max_rows = {max_rows}: keep at least 2 rows (default 10000)")
        self.loader = loader
        self.checkpointer = checkpointer
        self.out = local_path(out, "out") if out is not None else None
        self.gpus = gpus
        self.gpu_hourly_cost = gpu_hourly_cost
        self.title = title
        self.leak = dict(skip_steps=leak_skip_steps, share=leak_share,
                         min_bytes=leak_min_bytes, min_growth=leak_min_growth)
        self.rank = getattr(loader, "rank", None)
        if self.rank is None:
            self.rank = int(os.environ.get("RANK", 0))
        self._steps: List[Dict[str, Any]] = []  # finished rows of steps.jsonl
        self._rss: List[int] = []  # at the start of each row's first step
        self._max_rows = max_rows
        self._span = 1  # steps per row now: doubles each time the rows are merged
        self._pending: Optional[Dict[str, Any]] = None  # a row still taking steps
        self._pending_rss = 0
        self._finished = 0  # steps finished
        self._current: Optional[_Step] = None
        self._phase_depth = 0
        self._wrapped_s = 0.0  # time in next() of iterators from wrap()
        self._lock = threading.Lock()  # _steps and the histograms, read by the metrics thread
        self._hist = {"wall": _Histogram(), "input": _Histogram()}
        self._totals = dict.fromkeys(CAUSES, 0.0)
        self._comparison: Optional[Dict[str, Any]] = None
        self._started_unix: Optional[float] = None
        self._sampler: Any = None
        self._sampling = False
        # The Loader's stage counters at the first step and at close(): the input wait's split.
        self._stages_first: Optional[Dict[str, Any]] = None
        self._stages_last: Optional[Dict[str, Any]] = None
        if sample_system:
            self._sampler = _core.SystemSampler(pid=0, interval=interval,
                                                max_samples=max_samples)

    # --- measuring -----------------------------------------------------------------------------

    def _counters(self) -> Dict[str, float]:
        return {"input": (_loader_wait_s(self.loader) if self.loader is not None else 0.0)
                + self._wrapped_s,
                "checkpoint": (self.checkpointer.blocked_s
                               if self.checkpointer is not None else 0.0),
                # Loader(device="cuda") times its own copies with CUDA events.
                "h2d": (self.loader.h2d_wait_s if isinstance(self.loader, Loader) else 0.0)}

    @contextlib.contextmanager
    def step(self, samples: Optional[int] = None, bytes: Optional[int] = None  # noqa: A002
             ) -> Iterator["StepProfiler"]:
        """Marks one training step; ``samples`` and ``bytes`` (this rank's) give throughput."""
        now = time.monotonic()
        counters = self._counters()
        if self._current is None:  # the first step, or the first after close()
            if self._started_unix is None:
                self._started_unix = time.time()
            if self._stages_first is None:
                self._stages_first = _input_advice.stage_counters(self.loader)
            if self._sampler is not None and not self._sampling:
                self._sampler.start()
                self._sampling = True
        else:
            self._finish(self._current, now, counters)
        self._current = _Step(self._finished, now, counters, _rss_bytes(), samples, bytes)
        try:
            yield self
        finally:
            self._current.ended = (time.monotonic(), self._counters())

    @contextlib.contextmanager
    def phase(self, cause: str) -> Iterator[None]:
        """Counts the time inside as ``cause`` ("h2d", "communication", "other", or "input" and
        "checkpoint" for code that uses neither our Loader nor our Checkpointer, which count
        themselves) in the current step; a phase nested in another counts once, as the outer
        one. Before the first step the time counts nowhere."""
        if cause not in WAITS:
            raise ValueError(f"phase must be one of {', '.join(WAITS)}, not {cause!r}")
        started = time.monotonic()
        self._phase_depth += 1
        try:
            yield
        finally:
            self._phase_depth -= 1
            if self._phase_depth == 0 and self._current is not None:
                self._current.phases[cause] += time.monotonic() - started

    def wrap(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """An iterator over ``iterable`` whose next() counts as input wait. A zerowait Loader
        is not wrapped: it becomes :attr:`loader`, whose own wait counter is exact."""
        if isinstance(iterable, Loader):
            self.loader = iterable
            return iter(iterable)
        return self._timed(iter(iterable))

    def _timed(self, iterator: Iterator[Any]) -> Iterator[Any]:
        while True:
            started = time.monotonic()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self._wrapped_s += time.monotonic() - started
            yield item

    def _finish(self, step: _Step, end: float, counters: Dict[str, float]) -> None:
        record = self._record(step, end, counters)
        with self._lock:
            self._finished += 1
            if self._pending is None:
                self._pending, self._pending_rss = record, step.rss
            else:
                self._pending = _merged(self._pending, record)
            if self._pending["steps"] == self._span:
                self._steps.append(self._pending)
                self._rss.append(self._pending_rss)
                self._pending = None
                if len(self._steps) >= self._max_rows:
                    rows = self._steps
                    self._steps = [_merged(a, b) for a, b in zip(rows[::2], rows[1::2])]
                    self._steps += rows[len(self._steps) * 2:]  # an odd last row stays
                    self._rss = self._rss[::2]
                    self._span *= 2
            self._hist["wall"].observe(record["wall"])
            self._hist["input"].observe(record["input"])
            for cause in CAUSES:
                self._totals[cause] += record[cause]

    def _record(self, step: _Step, end: float, counters: Dict[str, float]) -> Dict[str, Any]:
        """The steps.jsonl line of ``step`` ending at ``end`` with ``counters`` there."""
        wall = max(end - step.t, 0.0)
        waits = dict(step.phases)
        for cause in counters:  # the waits measured by counters: input, checkpoint, h2d
            waits[cause] += max(counters[cause] - step.counters[cause], 0.0)
        spent = sum(waits.values())
        if spent > wall > 0:  # clocks of C++ counters and ours differ by microseconds
            waits = {c: s * wall / spent for c, s in waits.items()}
        record: Dict[str, Any] = {"step": step.index, "rank": self.rank, "t": step.t,
                                  "wall": wall}
        compute = max(wall - sum(waits.values()), 0.0)
        record.update({c: compute if c == "compute" else waits[c] for c in CAUSES})
        record["samples"] = step.samples
        record["bytes"] = step.bytes
        record["steps"] = 1
        return record

    def steps(self) -> List[Dict[str, Any]]:
        """Every step so far as steps.jsonl rows (one per step until ``max_rows``, then
        merged); the last one ends where its with-block did (it is extended if another step
        follows)."""
        with self._lock:
            steps = list(self._steps)
            if self._pending is not None:
                steps.append(self._pending)
        current = self._current
        if current is not None and current.ended is not None:
            steps.append(self._record(current, *current.ended))
        return steps

    def close(self) -> None:
        """Ends the last step where its with-block did and stops the system sampler."""
        current, self._current = self._current, None
        if current is not None and current.ended is not None:
            self._finish(current, *current.ended)
        if self._stages_first is not None:
            self._stages_last = _input_advice.stage_counters(self.loader)
        if self._sampling:
            self._sampler.stop()
            self._sampling = False

    def __enter__(self) -> "StepProfiler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        if self.out is not None:
            self.save()

    # --- results -------------------------------------------------------------------------------

    def histograms(self) -> Dict[str, Any]:
        """Finished steps for the metrics: ``step_seconds`` and ``step_input_wait_seconds``
        (``buckets`` as cumulative (upper bound, count) pairs, ``sum``, ``count``) and
        ``seconds`` per cause. A step counts once the next one starts (or at close())."""
        with self._lock:
            return {"step_seconds": self._hist["wall"].snapshot(),
                    "step_input_wait_seconds": self._hist["input"].snapshot(),
                    "seconds": dict(self._totals)}

    def system_samples(self) -> List[Dict[str, Any]]:
        """The system sampler's samples so far (system.jsonl), [] without one."""
        return list(self._sampler.samples()) if self._sampler is not None else []

    def flags(self) -> List[Dict[str, Any]]:
        """What looks wrong beside the shares: a resident set that only grows, swapping."""
        flags = []
        with self._lock:
            rss = self._rss[self.leak["skip_steps"]:]
        leak = _growth_flag(rss, self.leak)
        if leak is not None:
            flags.append(leak)
        steps = self.steps()
        if steps:
            start, end = steps[0]["t"], steps[-1]["t"] + steps[-1]["wall"]
            swap = _swap_flag([s for s in self.system_samples() if start <= s["t"] <= end])
            if swap is not None:
                flags.append(swap)
        return flags

    def summary(self) -> Dict[str, Any]:
        """The run.json of this run (docs/observe.md, kind "profile")."""
        steps = self.steps()
        wall = sum(s["wall"] for s in steps)
        causes = _core.cause_summary({c: sum(s[c] for s in steps) for c in CAUSES}, wall)
        shares = causes["shares"]
        summary: Dict[str, Any] = {
            "schema": SCHEMA, "kind": "profile", "title": self.title or _default_title(),
            "command": list(getattr(sys, "orig_argv", sys.argv)),
            "started_unix": self._started_unix, "duration_s": wall, **causes, "au": None,
            "throughput": _throughput(steps, wall), "cost": None,
            "comparison": self._comparison, "flags": self.flags()}
        # Input wait by stage, and the change most likely to cut it (zerowait/_input_advice.py).
        last = self._stages_last
        if last is None and self._stages_first is not None:
            last = _input_advice.stage_counters(self.loader)
        input_s = causes["seconds"]["input"]
        summary["input_stages"] = _input_advice.input_stages(input_s, self._stages_first, last)
        summary["advice"] = _input_advice.advice(input_s, wall,
                                                 sum(s["steps"] for s in steps),
                                                 self._stages_first, last)
        if self.gpu_hourly_cost is not None and wall > 0:
            summary["cost"] = _core.wait_cost(shares, self.gpus,
                                                   float(self.gpu_hourly_cost))
        return summary

    def save(self, out: Any = None) -> Path:
        """Writes the run directory (run.json, steps.jsonl, system.jsonl) to ``out`` (default:
        the constructor's) and returns its path; each file appears whole (written, then
        renamed)."""
        directory = Path(local_path(out, "out") if out is not None else self.out or "")
        if out is None and self.out is None:
            raise ValueError("save() needs a directory: pass out= here or to StepProfiler")
        _core.write_run(directory, self.summary(), {"steps.jsonl": self.steps(),
                                                    "system.jsonl": self.system_samples()})
        return directory

    def compare(self, before: Any) -> Dict[str, Any]:
        """The saving against the run directory ``before`` (its run.json), by
        ``_core.compare_runs``; it appears as ``comparison`` in :meth:`summary` from now on."""
        with open(Path(local_path(before, "before")) / "run.json") as f:
            earlier = json.load(f)
        self._comparison = None
        comparison = dict(_core.compare_runs(earlier, self.summary(), self.gpus,
                                                   float(self.gpu_hourly_cost or 0.0),
                                                   before_path=os.fspath(before)))
        self._comparison = comparison
        return comparison

    def report(self) -> str:
        """The summary as a table for a terminal: shares per cause, verdict, flags, money."""
        return format_report(self.summary(), sum(row["steps"] for row in self.steps()))


def money_line(cost: Dict[str, Any], cause: str) -> str:
    """"input wait costs $X/day, $Y/year on 8 GPUs at $2.00/h"."""
    return (f"{cause} wait costs ${cost['per_day'][cause]:,.2f}/day, "
            f"${cost['per_year'][cause]:,.2f}/year on {cost['gpus']} GPUs at "
            f"${cost['gpu_hourly_cost']:,.2f}/h")


def format_report(summary: Dict[str, Any], steps: Optional[int] = None) -> str:
    """A run.json (of ``steps`` steps) as the table report() prints."""
    shares, seconds = summary["shares"], summary["seconds"]
    counted = f"{steps} steps in " if steps is not None else ""
    lines = [f"{summary['title']}: {counted}{summary['duration_s']:.2f} s", "",
             f"{'cause':<14} {'seconds':>9} {'share':>7}"]
    for cause in summary["causes"]:
        bar = "#" * round(40 * shares[cause])
        lines.append(f"{cause:<14} {seconds[cause]:>9.3f} {100 * shares[cause]:>6.1f} % {bar}")
    lines += ["", f"verdict: {summary['verdict']}"]
    stages = summary.get("input_stages")
    input_s = seconds.get("input", 0.0)
    if stages and input_s > 0:
        names = {"map": "map fn", "read": "read", "decode": "decode", "other": "other"}
        lines.append("input wait by stage: " + ", ".join(
            f"{names[k]} {100 * v / input_s:.0f} %" for k, v in stages.items()
            if v >= 0.005 * input_s))
    for item in summary.get("advice") or []:
        lines.append(f"change: {item['summary']}")
    throughput = summary.get("throughput")
    if throughput:
        parts = [f"{throughput[k]:,.1f} {unit}" for k, unit in
                 (("samples_per_s", "samples/s"), ("mb_per_s", "MB/s"))
                 if throughput.get(k) is not None]
        lines.append("throughput: " + ", ".join(parts))
    for flag in summary.get("flags") or []:
        lines.append(f"flag {flag['flag']}: {flag['summary']}")
    cost = summary.get("cost")
    if cost:
        waits = [c for c in summary["causes"] if c != "compute"]
        largest = max(waits, key=lambda c: shares[c])
        lines.append(money_line(cost, largest))
        lines.append(f"all waits cost ${cost['wait_per_day']:,.2f}/day, "
                     f"${cost['wait_per_year']:,.2f}/year")
    else:
        lines.append("(pass gpu_hourly_cost= to see what the waits cost)")
    comparison = summary.get("comparison")
    if comparison:
        lines.append(f"against {comparison['before']}: {100 * comparison['saving_share']:.1f} % "
                     f"less GPU time, ${comparison['saving_per_day']:,.2f}/day, "
                     f"${comparison['saving_per_year']:,.2f}/year")
    return "\n".join(lines) + "\n"


def _growth_flag(rss: Sequence[int], rule: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The "rss_growth" flag when the resident set at step starts grows as ``rule`` says."""
    deltas = [b - a for a, b in zip(rss, rss[1:])]
    if len(deltas) < 4:
        return None
    growing = sum(d > 0 for d in deltas) / len(deltas)
    grown = rss[-1] - rss[0]
    if growing < rule["share"] or grown < rule["min_bytes"] or grown < rule["min_growth"] * rss[0]:
        return None
    return {"flag": "rss_growth", "severity": "warn",
            "summary": f"the resident set grew in {100 * growing:.0f} % of {len(deltas)} steps, "
                       f"by {grown / 2**20:.0f} MiB (+{100 * grown / rss[0]:.0f} %): tensors "
                       f"kept across steps (e.g. a loss summed without .detach())?",
            "rss_first": rss[0], "rss_last": rss[-1], "growing_share": growing}


def _swap_flag(samples: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The "swap" flag when any system sample during the steps saw pages swapped in or out."""
    swapping = [s for s in samples if (s.get("swap_in") or 0) > 0 or (s.get("swap_out") or 0) > 0]
    if not swapping:
        return None
    peak_in = max(s.get("swap_in") or 0 for s in swapping)
    peak_out = max(s.get("swap_out") or 0 for s in swapping)
    return {"flag": "swap", "severity": "warn",
            "summary": f"the machine swapped during training in {len(swapping)} of "
                       f"{len(samples)} samples (up to {peak_in:.0f} pages/s in, {peak_out:.0f} "
                       f"pages/s out): memory is short",
            "samples": len(swapping), "swap_in_peak": peak_in, "swap_out_peak": peak_out}


def _merged(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """Two neighbouring rows of steps.jsonl as one: ``a``'s start, the sums of the rest."""
    row = dict(a)
    for key in ("wall", *CAUSES, "steps"):
        row[key] = a[key] + b[key]
    for key in ("samples", "bytes"):  # None where no step said
        given = [r[key] for r in (a, b) if r[key] is not None]
        row[key] = sum(given) if given else None
    return row


def _throughput(steps: Sequence[Dict[str, Any]], wall: float) -> Optional[Dict[str, Any]]:
    samples = [s["samples"] for s in steps if s["samples"] is not None]
    nbytes = [s["bytes"] for s in steps if s["bytes"] is not None]
    if wall <= 0 or not (samples or nbytes):
        return None
    return {"samples_per_s": sum(samples) / wall if samples else None,
            "mb_per_s": sum(nbytes) / 1e6 / wall if nbytes else None}


def _default_title() -> str:
    return f"profile of {os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'python'}"
