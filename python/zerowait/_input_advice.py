"""Input wait split by stage, and the one change most likely to cut it, with the number behind
it: what the StepProfiler adds to run.json as ``input_stages`` and ``advice`` (docs/observe.md,
"Verdicts that name the change").

The split comes from the Loader's own counters over the profiled steps: ``map`` is the time
next() waited on the map function's results (``stats()["map"]["wait_s"]``), ``loader`` the time
it waited on the native pipeline (``stats()["wait_s"]``), divided into ``read`` and ``decode`` in
proportion to the time the pipeline's threads spent in each (``read_s``, ``decode_s``); input
wait timed around anything else (``prof.wrap``, ``prof.phase("input")``) is ``other``.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

# A stage this large a part of the input wait is the one to change.
MAIN_STAGE_SHARE = 0.5
# Advice is given for an input wait this large a share of the wall time (the verdict's rule).
INPUT_BOUND_SHARE = 0.25


def stage_counters(loader: Any) -> Optional[Dict[str, Any]]:
    """The counters of a zerowait Loader that the split needs, now; None for anything else."""
    stats_of = getattr(loader, "stats", None)
    if stats_of is None or not hasattr(loader, "wait_s"):
        return None
    stats = stats_of()
    if "read_s" not in stats:
        return None
    mapped = stats.get("map") or {}
    return {"loader_wait": stats.get("wait_s", 0.0), "read_s": stats.get("read_s", 0.0),
            "decode_s": stats.get("decode_s", 0.0), "map_wait": mapped.get("wait_s", 0.0),
            "map_fn": mapped.get("fn_s", 0.0), "map_samples": mapped.get("samples", 0),
            "map_workers": mapped.get("workers"), "map_mode": mapped.get("mode")}


def input_stages(input_s: float, before: Optional[Dict[str, Any]],
                 after: Optional[Dict[str, Any]]) -> Optional[Dict[str, float]]:
    """Seconds of ``input_s`` by stage: map, read, decode, other. None without counters."""
    if before is None or after is None:
        return None
    mapped = max(after["map_wait"] - before["map_wait"], 0.0)
    native = max(after["loader_wait"] - before["loader_wait"], 0.0)
    read = max(after["read_s"] - before["read_s"], 0.0)
    decode = max(after["decode_s"] - before["decode_s"], 0.0)
    read_part = read / (read + decode) if read + decode > 0 else 1.0
    stages = {"map": mapped, "read": native * read_part, "decode": native * (1 - read_part)}
    stages["other"] = max(input_s - sum(stages.values()), 0.0)
    return stages


def map_advice(stages: Dict[str, float], input_s: float, wall: float, steps: int,
               before: Dict[str, Any], after: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The map function's advice when it is most of an input-bound run's wait: twice the map
    workers (``map_workers=0``, inline: 2). The model: the map stage makes a batch every
    ``period / (new workers / workers)``, the loop needs one per ``step time - input wait``;
    the wait left is the difference. It assumes the function's time does not grow with more
    workers (free cores, or a function that waits on I/O)."""
    if steps <= 0 or wall <= 0 or input_s <= 0:
        return None
    if input_s / wall < INPUT_BOUND_SHARE or stages["map"] / input_s < MAIN_STAGE_SHARE:
        return None
    samples = after["map_samples"] - before["map_samples"]
    fn_s = after["map_fn"] - before["map_fn"]
    if samples <= 0 or fn_s <= 0:
        return None
    workers = int(after["map_workers"] or 0)
    inline = after["map_mode"] == "inline" or workers == 0
    new_workers = 2 if inline else 2 * workers
    fn_per_sample = fn_s / samples
    fn_per_step = fn_s / steps
    rest_per_step = (wall - input_s) / steps  # compute and the other waits
    # Inline, the function runs inside next() after the step, and new workers would share its
    # time. With workers, the loop waiting on them takes a batch as often as they make one: the
    # step time is their period (fn time and each batch's transfer), which scales with them.
    made_per_step = (fn_per_step / new_workers if inline else
                     (wall / steps) * workers / new_workers)
    wait_after = max(made_per_step - rest_per_step, 0.0)
    step_after = rest_per_step + wait_after
    share = stages["map"] / input_s
    change = f"map_workers={0 if inline else workers} -> {new_workers}"
    summary = (f"map fn is {100 * share:.0f} % of input wait: {change} would cut it from "
               f"{1000 * input_s / steps:.1f} to about {1000 * wait_after:.1f} ms/step (step "
               f"{1000 * wall / steps:.1f} -> {1000 * step_after:.1f} ms); measured fn time "
               f"{1000 * fn_per_sample:.1f} ms/sample")
    return {"cause": "input", "stage": "map", "share_of_input": share, "change": change,
            "fn_ms_per_sample": 1000 * fn_per_sample,
            "input_s_per_step": input_s / steps, "predicted_input_s_per_step": wait_after,
            "step_s": wall / steps, "predicted_step_s": step_after,
            "predicted_input_share": wait_after / step_after if step_after > 0 else 0.0,
            "summary": summary}


def loader_advice(stages: Dict[str, float], input_s: float, wall: float,
                  steps: int) -> Optional[Dict[str, Any]]:
    """The native pipeline's advice when it is most of an input-bound run's wait: the stage that
    took its threads the longest, and the setting that feeds it."""
    if steps <= 0 or wall <= 0 or input_s <= 0 or input_s / wall < INPUT_BOUND_SHARE:
        return None
    native = stages["read"] + stages["decode"]
    if native / input_s < MAIN_STAGE_SHARE:
        return None
    stage = "decode" if stages["decode"] > stages["read"] else "read"
    change = ("more loader threads (threads=N)" if stage == "decode" else
              "pack small files into shards, or io='io_uring' and a deeper prefetch")
    share = stages[stage] / input_s
    summary = (f"{stage} is {100 * share:.0f} % of input wait "
               f"({1000 * stages[stage] / steps:.1f} ms/step): {change}")
    return {"cause": "input", "stage": stage, "share_of_input": share, "change": change,
            "input_s_per_step": input_s / steps, "summary": summary}


def advice(input_s: float, wall: float, steps: int, before: Optional[Dict[str, Any]],
           after: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """run.json's ``advice``: [] when there is nothing to say or no Loader counters."""
    stages = input_stages(input_s, before, after)
    if stages is None or not math.isfinite(input_s):
        return []
    found = (map_advice(stages, input_s, wall, steps, before, after)
             or loader_advice(stages, input_s, wall, steps))
    return [found] if found else []
