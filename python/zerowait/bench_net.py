"""``zerowait bench net``: what the network costs a training step, through torch.distributed.

Run as ``python -m zerowait.bench_net [options]`` (the ``zerowait bench net`` command execs
exactly that: the engine is C++, but torch.distributed is only reachable from Python).

Ranks: under torchrun (``RANK`` and ``WORLD_SIZE`` in the environment, with ``MASTER_ADDR`` /
``MASTER_PORT``; ``LOCAL_RANK`` defaults to 0) this process is one rank of that launch;
otherwise it starts ``--ranks`` processes of itself on 127.0.0.1. Backend ``auto`` is NCCL
when each rank on the host has a GPU of its own, else gloo. With gloo and no
``GLOO_SOCKET_IFNAME``, each rank sets it to the interface that carries its traffic to
rank 0, so the all-reduce runs over the path the MTU probe measures. Rank 0 prints.

1. All-reduce of float32 tensors per ``--sizes``: ``--warmup`` calls, a barrier, then
   ``--iters`` timed calls; the time is the slowest rank's. Bandwidths as nccl-tests defines
   them: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n. The communication share of a
   step: ``--grad-bytes`` all-reduced beside ``--compute-ms`` of compute, share = t / (t +
   compute), with t interpolated (log-log) between the measured sizes, or extrapolated at the
   largest size's bandwidth. It assumes no overlap: DDP hides part of t behind backward.
2. Path MTU (unless ``--no-mtu-probe``) between rank 0 and every other rank, both ways. The
   receiver answers each UDP datagram with a small ack, so only one direction carries large
   ones; the sender sets the don't-fragment bit (IP_PMTUDISC_PROBE: up to its interface's MTU,
   whatever path MTU the kernel cached) and binary-searches the payload between 548 bytes and
   MTU - 28, three tries per size. Path MTU = largest payload that arrived + 28. A mismatch:
   the path MTU is below either end's interface MTU, or the two ends' MTUs differ. Ranks on
   the same host (same boot id and network namespace) are reported as such and not probed.
3. ``--halving``: the field's test of what bounds a step. A DDP model whose parameters hold
   ``--grad-bytes`` (capped to fit memory), with ``--compute-ms`` of emulated compute (sleeps
   between the layers, a third in forward and two thirds in backward, so DDP's bucketed
   all-reduce overlaps with it as on a GPU; sleeping leaves the CPU to the input workers, as a
   GPU does), runs three ways: (a) fed by the input pipeline (``--data``: a zerowait dataset
   through zerowait.Loader, or a directory of files through torch DataLoader with
   ``--workers``; without it, synthetic samples that each cost ``--sample-ms``), (b) with the
   input removed (a pre-made batch), (c) as (a) without the all-reduce (DDP's no_sync). The
   verdict: input-bound when removing the input shortens the step most, communication-bound
   when removing the all-reduce does, compute-bound when neither shortens it by more than
   10 % (``HALVING_THRESHOLD``). Three warm-up steps come before ``--steps`` timed ones.

The probe (2.) lives in ``_net_mtu.py``, the halving test (3.) in ``_net_halving.py``.

``--json`` prints one object on stdout::

    {"schema": "zerowait.bench_net/1", "launch": "local" | "torchrun", "world_size": 2,
     "backend": "gloo", "device": "cpu", "hosts": 1,  (network stacks: hosts or namespaces)
     "allreduce": [{"bytes": 4096, "iters": 20, "seconds_per_op": 4.1e-05,
                    "algbw_bytes_per_s": 1.0e+08, "busbw_bytes_per_s": 1.0e+08}, ...],
     "step": {"grad_bytes": 104857600, "compute_ms": 100.0, "comm_seconds": 0.05,
              "share": 0.33, "estimate": "measured" | "interpolated" | "extrapolated"},
     "mtu": null | {"pairs": [PAIR, ...], "mismatches": ["rank 0 (...) -> rank 1 (...): ..."]},
     "halving": null | {"input": "synthetic" | "zerowait" | "files", "steps": 20,
                        "batch_size": 8, "workers": 2, "sample_ms": 2.0, "compute_ms": 100.0,
                        "grad_bytes": ..., "model_bytes": ...,
                        "step_seconds": {"configured": ..., "input_removed": ...,
                                         "allreduce_removed": ...},
                        "gain": {"input_removed": 0.4, "allreduce_removed": 0.05},
                        "threshold": 0.1, "verdict": "input-bound" | "communication-bound"
                        | "compute-bound", "reason": "..."}}

    PAIR = {"ranks": [0, 1], "status": "ok" | "mismatch" | "same host" | "failed",
            "ends": [ENDPOINT, ENDPOINT], "message": "..." (same host, failed),
            "directions": [{"from": 0, "to": 1, "status": "ok" | "mismatch" | "unreachable"
                            | "error", "largest_payload": 1476, "path_mtu": 1500,
                            "message": "..."}, ...]}
    (largest_payload: the largest UDP payload that arrived; path_mtu: that + 28, at most the
    receiver's MTU, since veth and many NICs take a few bytes more than their MTU says)
    ENDPOINT = {"rank": 0, "ip": "10.231.0.1", "interface": "veth-a", "mtu": 9000}

Exit status: 0; 3 when the probe found an MTU mismatch; 1 on an error.
"""

from __future__ import annotations

import argparse
import bisect
import importlib.util
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence

from zerowait._net_halving import BenchError, max_over_ranks, run_halving
from zerowait._net_mtu import Endpoint, endpoint_toward, probe_mtu

SCHEMA = "zerowait.bench_net/1"
EXIT_MISMATCH = 3  # the CLI's "completed, but found problems"
_LAUNCH_ENV = "ZEROWAIT_BENCH_NET_LAUNCH"  # set on the processes this module starts itself
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


# ---------------------------------------------------------------------------------------------
# Options


def parse_size(text: str) -> int:
    """'4K' -> 4096: binary multiples, as the zerowait size options take them."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m or int(m[1]) == 0:
        raise argparse.ArgumentTypeError(f"a size is a positive number with K, M, G or T, got "
                                         f"{text!r}")
    return int(m[1]) * _UNITS[m[2].upper()]


def parse_sizes(text: str) -> List[int]:
    return sorted({parse_size(t) for t in text.split(",") if t.strip()})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zerowait bench net", description=(
        "All-reduce bandwidth, path MTU between ranks, and what bounds a training step."))
    p.add_argument("--ranks", type=int, default=None,
                   help="local processes to start when not under torchrun (default 2)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4K,64K,1M,16M,64M"))
    p.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size")
    p.add_argument("--compute-ms", type=float, default=100.0)
    p.add_argument("--grad-bytes", type=parse_size, default=parse_size("100M"))
    p.add_argument("--no-mtu-probe", action="store_true")
    p.add_argument("--halving", action="store_true")
    p.add_argument("--data", default=None, help="--halving input: dataset or directory")
    p.add_argument("--workers", type=int, default=2, help="--halving input workers")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="--halving timed steps per variant")
    p.add_argument("--sample-ms", type=float, default=2.0,
                   help="--halving without --data: cost of each synthetic sample")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a collective may wait for a peer before failing")
    p.add_argument("--json", action="store_true")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("iters", "steps", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("warmup", "workers", "compute_ms", "sample_ms"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.ranks is not None and args.ranks < 1:
        parser.error(f"--ranks must be >= 1, got {args.ranks}")
    return args


# ---------------------------------------------------------------------------------------------
# Formatting


def format_bytes(n: float) -> str:
    """4096 -> '4 KiB', 1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def format_rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.3f} GB/s"  # decimal GB/s, as nccl-tests prints


def print_table(rows: List[List[str]], right: Sequence[bool]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)]
        print("  " + "  ".join(cells).rstrip())


# ---------------------------------------------------------------------------------------------
# All-reduce bandwidth and the communication share of a step


def bus_bandwidth(algbw: float, world: int) -> float:
    """nccl-tests' bus bandwidth of all-reduce: what each link carries."""
    return algbw * 2 * (world - 1) / world


def measure_allreduce(args: argparse.Namespace, world: int, device: Any,
                      control: Any) -> List[Dict[str, Any]]:
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for size in args.sizes:
        elements = max(1, size // 4)
        # Zeros stay zeros under summation: no overflow to inf, no denormals.
        tensor = torch.zeros(elements, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(tensor)
        sync()
        dist.barrier(group=control)
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(tensor)
        sync()
        per_op = max_over_ranks(time.perf_counter() - start, control) / args.iters
        algbw = elements * 4 / per_op
        rows.append({"bytes": elements * 4, "iters": args.iters, "seconds_per_op": per_op,
                     "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": bus_bandwidth(algbw, world)})
        del tensor
    return rows


def allreduce_seconds(rows: List[Dict[str, Any]], nbytes: int) -> tuple[float, str]:
    """The all-reduce time of `nbytes`: log-log interpolation between measured sizes; past the
    largest at its bandwidth (large messages are bandwidth-bound); below the smallest, its
    time (small ones are latency-bound)."""
    sizes = [r["bytes"] for r in rows]
    times = [r["seconds_per_op"] for r in rows]
    i = bisect.bisect_left(sizes, nbytes)
    if i < len(sizes) and sizes[i] == nbytes:
        return times[i], "measured"
    if i == len(sizes):
        return times[-1] * nbytes / sizes[-1], "extrapolated"
    if i == 0:
        return times[0], "extrapolated"
    x0, x1 = math.log(sizes[i - 1]), math.log(sizes[i])
    y0, y1 = math.log(times[i - 1]), math.log(times[i])
    return math.exp(y0 + (y1 - y0) * (math.log(nbytes) - x0) / (x1 - x0)), "interpolated"


def comm_share(rows: List[Dict[str, Any]], grad_bytes: int, compute_ms: float) -> Dict[str, Any]:
    seconds, estimate = allreduce_seconds(rows, grad_bytes)
    return {"grad_bytes": grad_bytes, "compute_ms": compute_ms, "comm_seconds": seconds,
            "share": seconds / (seconds + compute_ms / 1e3), "estimate": estimate}


# ---------------------------------------------------------------------------------------------
# Report


def print_report(report: Dict[str, Any]) -> None:
    print(f"all-reduce: {report['world_size']} ranks on {report['hosts']} "
          f"host{'s' if report['hosts'] != 1 else ''}, {report['backend']} on "
          f"{report['device']}; float32, time of the slowest rank")
    rows = [["size", "time/op", "algbw", "busbw"]]
    for r in report["allreduce"]:
        rows.append([format_bytes(r["bytes"]), format_seconds(r["seconds_per_op"]),
                     format_rate(r["algbw_bytes_per_s"]), format_rate(r["busbw_bytes_per_s"])])
    print_table(rows, [False, True, True, True])
    s = report["step"]
    estimate, hint = s["estimate"], ""
    if estimate == "extrapolated":
        above = s["grad_bytes"] > report["allreduce"][-1]["bytes"]
        estimate += f" from {format_bytes(report['allreduce'][-1 if above else 0]['bytes'])}"
        hint = f"; add {format_bytes(s['grad_bytes']).replace(' ', '')} to --sizes to measure it"
    print(f"step: {format_bytes(s['grad_bytes'])} of gradients all-reduce in "
          f"{format_seconds(s['comm_seconds'])} ({estimate}) beside "
          f"{s['compute_ms']:g} ms of compute: communication is {s['share']:.0%} of the step "
          f"without overlap{hint}")
    mtu = report["mtu"]
    if mtu is not None:
        print("\npath MTU:")
        for pair in mtu["pairs"]:
            if pair["status"] == "same host":
                print(f"  {pair['message']}")
            for d in pair["directions"]:
                if "message" in d:
                    print(f"  {d['status'].upper()} {d['message']}")
                else:
                    src, dst = (pair["ends"] if d["from"] == 0 else pair["ends"][::-1])
                    print(f"  ok  rank {d['from']} ({src['interface']}, MTU {src['mtu']}) -> "
                          f"rank {d['to']} ({dst['interface']}, MTU {dst['mtu']}): path MTU "
                          f"{d['path_mtu']}")
    h = report["halving"]
    if h is not None:
        source = {"synthetic": f"synthetic samples of {h['sample_ms'] or 0:g} ms",
                  "zerowait": "zerowait.Loader", "files": "DataLoader over files"}[h["input"]]
        workers = f"{h['workers']} worker{'' if h['workers'] == 1 else 's'}"
        print(f"\nhalving: {h['steps']} steps of batch {h['batch_size']}, {source}, {workers}, "
              f"{format_bytes(h['model_bytes'])} of gradients, {h['compute_ms']:g} ms of compute")
        base = h["step_seconds"]["configured"]
        rows = [["configured", format_seconds(base), ""]]
        for key, label in (("input_removed", "input removed"),
                           ("allreduce_removed", "all-reduce removed")):
            rows.append([label, format_seconds(h["step_seconds"][key]), f"{-h['gain'][key]:+.0%}"])
        print_table(rows, [False, True, True])
        print(f"verdict: {h['verdict']}: {h['reason']}")


# ---------------------------------------------------------------------------------------------
# Ranks


def resolve_ipv4(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise BenchError(f"MASTER_ADDR={host!r} does not resolve to an IPv4 address ({e}); "
                         "set MASTER_ADDR to rank 0's IPv4 address") from e


def pick_backend(requested: str, local_rank: int) -> str:
    """NCCL needs a GPU for each rank on this host (LOCAL_WORLD_SIZE, set by torchrun): auto
    takes it only then, so that every rank picks the same backend."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1))
    if requested == "nccl" and not (gpus and dist.is_nccl_available()):
        raise BenchError("--backend nccl needs CUDA and a torch built with NCCL; this one has "
                         f"{'no NCCL' if gpus else 'no CUDA device'}: use --backend gloo")
    if requested == "nccl" and local_rank >= gpus:
        raise BenchError(f"LOCAL_RANK {local_rank} has no GPU of its own ({gpus} visible): "
                         f"start at most {gpus} ranks per host, or use --backend gloo")
    if requested == "auto":
        return "nccl" if dist.is_nccl_available() and 0 < local_world <= gpus else "gloo"
    return requested


def run_rank(args: argparse.Namespace, launch: str) -> int:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise BenchError(f"RANK and WORLD_SIZE are set but {' and '.join(missing)} is not; "
                         "launch with torchrun or set both")
    if args.ranks is not None and args.ranks != world and rank == 0:
        print(f"note: --ranks {args.ranks} ignored: this launch has WORLD_SIZE={world}",
              file=sys.stderr)
    master_ip = resolve_ipv4(os.environ["MASTER_ADDR"])
    me = endpoint_toward(rank, master_ip)
    backend = pick_backend(args.backend, local_rank)
    if backend == "gloo" and not os.environ.get("GLOO_SOCKET_IFNAME") and me.interface:
        # gloo otherwise binds the address the host name resolves to (often 127.0.x.1).
        os.environ["GLOO_SOCKET_IFNAME"] = me.interface
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        # Objects, barriers and timings travel over gloo even when tensors use NCCL.
        control = dist.new_group(backend="gloo") if backend == "nccl" else None
        gathered: List[Any] = [None] * world
        dist.all_gather_object(gathered, asdict(me), group=control)
        endpoints = [Endpoint(**e) for e in gathered]
        rows = measure_allreduce(args, world, device, control)
        report: Dict[str, Any] = {
            "schema": SCHEMA, "launch": launch, "world_size": world, "backend": backend,
            "device": str(device) if device.type == "cpu" else "cuda",
            "hosts": len({e.host for e in endpoints}), "allreduce": rows,
            "step": comm_share(rows, args.grad_bytes, args.compute_ms), "mtu": None,
            "halving": None}
        if not args.no_mtu_probe:
            report["mtu"] = probe_mtu(rank, world, endpoints, master_ip, control)
        if args.halving:
            report["halving"] = run_halving(args, rank, world, device, control)
        dist.barrier(group=control)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    sys.stdout.flush()
    return EXIT_MISMATCH if report["mtu"] and report["mtu"]["mismatches"] else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Starts --ranks processes of this module on 127.0.0.1 and returns rank 0's exit status;
    when one fails, the others are stopped at once instead of waiting for the timeout."""
    world = args.ranks or 2
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), **{_LAUNCH_ENV: "local"})
    # As torchrun does: ranks that each spin one OpenMP thread per core would take turns on
    # the cores instead of running.
    env.setdefault("OMP_NUM_THREADS", "1")
    procs: List[subprocess.Popen] = []
    try:
        for rank in range(world):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "zerowait.bench_net", *argv], stdin=subprocess.DEVNULL,
                stdout=None if rank == 0 else subprocess.DEVNULL,
                env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank))))
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0, EXIT_MISMATCH)]
            if failed:
                rank, code = failed[0]
                print(f"zerowait bench net: rank {rank} exited with status {code}; stopping the "
                      "others", file=sys.stderr)
                return code if code > 0 else 1
            if all(c is not None for c in codes):
                return codes[0]
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    # find_spec, not import: the launcher itself needs no torch, and importing it takes seconds.
    if importlib.util.find_spec("torch") is None:
        print(f"zerowait bench net: error: torch is not installed for {sys.executable}; install "
              f"it into that environment ({sys.executable} -m pip install torch)", file=sys.stderr)
        return 1
    try:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            return run_rank(args, os.environ.get(_LAUNCH_ENV, "torchrun"))
        return launch_local(args, argv)
    except BenchError as e:
        rank = os.environ.get("RANK")
        where = f" (rank {rank})" if rank is not None else ""
        print(f"zerowait bench net: error{where}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
