"""`zerowait bench net`: all-reduce bandwidth through torch.distributed (gloo, real ranks), the
path-MTU probe between two network namespaces joined by a veth pair, the halving test's
verdict, and the command's search for a Python with torch. Nothing asserts on speed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from zerowait import _net_halving, bench_net

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (scripts/setup.sh installs it)")
TIMEOUT = 300  # per run: importing torch takes seconds per rank on a loaded 2-core machine


def run(cmd: list, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, env=env)


def report_of(result: subprocess.CompletedProcess, codes=(0,)) -> dict:
    assert result.returncode in codes, f"status {result.returncode}\n{result.stderr[-3000:]}"
    return json.loads(result.stdout)


@needs_torch
def test_allreduce_bandwidth_and_step_share_with_gloo(cli):
    report = report_of(run([cli, "bench", "net", "--ranks", "2", "--sizes", "4K,1M", "--iters",
                            "5", "--json"]))
    assert report["schema"] == bench_net.SCHEMA
    assert (report["world_size"], report["backend"], report["launch"]) == (2, "gloo", "local")
    rows = report["allreduce"]
    assert [r["bytes"] for r in rows] == [4096, 1 << 20]
    for r in rows:
        assert r["iters"] == 5 and r["seconds_per_op"] > 0
        assert r["busbw_bytes_per_s"] > 0
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] * 2 * (2 - 1) / 2)
        assert r["algbw_bytes_per_s"] == pytest.approx(r["bytes"] / r["seconds_per_op"])
    step = report["step"]
    assert step["grad_bytes"] == 100 << 20 and step["estimate"] == "extrapolated"
    assert 0 < step["share"] < 1
    # Both ranks share one network stack: the probe says so instead of measuring loopback.
    assert [p["status"] for p in report["mtu"]["pairs"]] == ["same host"]
    assert report["mtu"]["mismatches"] == []


def test_help_lists_the_options_the_module_takes(cli):
    """The command forwards its options to the module: the two must name the same ones."""
    text = run([cli, "bench", "net", "--help"]).stdout
    in_cli = set(re.findall(r"(--[a-z][a-z-]+)", text)) - {"--help"}
    in_module = {s for a in bench_net.build_parser()._actions for s in a.option_strings
                 if s.startswith("--")} - {"--help"}
    assert in_cli >= in_module, f"missing from the CLI: {sorted(in_module - in_cli)}"


def test_missing_interpreter_and_missing_torch_are_named(cli, tmp_path):
    env = dict(os.environ, ZEROWAIT_PYTHON=str(tmp_path / "no-python"))
    result = run([cli, "bench", "net", "--iters", "1"], env=env)
    assert result.returncode == 1
    assert f"ZEROWAIT_PYTHON={tmp_path / 'no-python'} (not an executable file)" in result.stderr

    # A bare virtual environment: an interpreter without torch.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "bare"], check=True,
                   timeout=120)
    bare = tmp_path / "bare" / "bin" / "python3"
    result = run([cli, "bench", "net", "--iters", "1"], env=dict(os.environ, ZEROWAIT_PYTHON=bare))
    assert result.returncode == 1
    assert f"{bare} (ZEROWAIT_PYTHON) has no torch" in result.stderr
    assert f"{bare} -m pip install torch" in result.stderr


# ---------------------------------------------------------------------------------------------
# Path MTU across two network namespaces


def can_make_namespaces() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    return None


@pytest.fixture()
def veth_pair():
    """Makes two network namespaces joined by a veth pair (veth-a in the first, veth-b in the
    second) with the given MTUs, and deletes them afterwards, whatever happened."""
    reason = can_make_namespaces()
    if reason:
        pytest.skip(reason)
    made: list[str] = []

    def make(mtu_a: int, mtu_b: int) -> tuple[str, str, str]:
        tag = f"zwt-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        a, b = f"{tag}-a", f"{tag}-b"
        for ns in (a, b):
            result = run(["ip", "netns", "add", ns])
            if result.returncode != 0:
                pytest.skip(f"cannot make a network namespace: {result.stderr.strip()}")
            made.append(ns)
        subnet = f"10.231.{os.getpid() % 250}"
        steps = [["ip", "link", "add", "veth-a", "netns", a, "type", "veth", "peer", "name",
                  "veth-b", "netns", b],
                 ["ip", "-n", a, "addr", "add", f"{subnet}.1/24", "dev", "veth-a"],
                 ["ip", "-n", b, "addr", "add", f"{subnet}.2/24", "dev", "veth-b"],
                 ["ip", "-n", a, "link", "set", "veth-a", "mtu", str(mtu_a), "up"],
                 ["ip", "-n", b, "link", "set", "veth-b", "mtu", str(mtu_b), "up"],
                 ["ip", "-n", a, "link", "set", "lo", "up"],
                 ["ip", "-n", b, "link", "set", "lo", "up"]]
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=30)
        return a, b, subnet

    try:
        yield make
    finally:
        for ns in made:  # deleting a namespace deletes its veth end, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def run_ranks_in(namespaces: tuple[str, str], master: str) -> list[subprocess.CompletedProcess]:
    """Rank 0 in the first namespace, rank 1 in the second, as torchrun would start them."""
    procs = []
    try:
        for rank, ns in enumerate(namespaces):
            cmd = ["ip", "netns", "exec", ns, "env", f"RANK={rank}", "WORLD_SIZE=2",
                   f"MASTER_ADDR={master}", "MASTER_PORT=29500", sys.executable, "-m",
                   "zerowait.bench_net", "--sizes", "4K", "--iters", "2", "--timeout", "60",
                   "--json"]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          stdin=subprocess.DEVNULL, text=True))
        results = []
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        return results
    finally:
        for p in procs:  # `ip netns exec` execs the command: these are the ranks themselves
            if p.poll() is None:
                p.kill()
                p.wait()


@needs_torch
def test_mtu_probe_names_a_mismatch_between_namespaces(veth_pair):
    a, b, subnet = veth_pair(9000, 1500)
    rank0, rank1 = run_ranks_in((a, b), f"{subnet}.1")
    assert rank1.returncode == 0, rank1.stderr[-3000:]
    report = report_of(rank0, codes=(bench_net.EXIT_MISMATCH,))
    assert report["hosts"] == 2
    [pair] = report["mtu"]["pairs"]
    assert pair["status"] == "mismatch"
    assert pair["ends"] == [
        {"rank": 0, "ip": f"{subnet}.1", "interface": "veth-a", "mtu": 9000},
        {"rank": 1, "ip": f"{subnet}.2", "interface": "veth-b", "mtu": 1500}]
    out, back = pair["directions"]
    end0 = f"rank 0 ({subnet}.1, veth-a, MTU 9000)"
    end1 = f"rank 1 ({subnet}.2, veth-b, MTU 1500)"
    # 9000 -> 1500: jumbo datagrams leave rank 0 and are dropped at rank 1's interface.
    assert (out["from"], out["to"], out["status"], out["path_mtu"]) == (0, 1, "mismatch", 1500)
    assert out["message"] == (f"{end0} -> {end1}: datagrams above 1472 bytes are lost; set the "
                              "same MTU on both ends (ip link set dev veth-a mtu 1500)")
    # 1500 -> 9000: everything rank 1 can send arrives, but the ends disagree.
    assert (back["from"], back["to"], back["status"], back["path_mtu"]) == (1, 0, "mismatch", 1500)
    assert back["message"].startswith(f"{end1} -> {end0}: the MTUs differ")
    assert "ip link set dev veth-a mtu 1500" in back["message"]
    assert report["mtu"]["mismatches"] == [out["message"], back["message"]]


@needs_torch
def test_mtu_probe_reports_no_mismatch_when_the_mtus_match(veth_pair):
    a, b, subnet = veth_pair(9000, 9000)
    rank0, rank1 = run_ranks_in((a, b), f"{subnet}.1")
    assert rank1.returncode == 0, rank1.stderr[-3000:]
    report = report_of(rank0)
    [pair] = report["mtu"]["pairs"]
    assert pair["status"] == "ok"
    assert [(d["from"], d["to"], d["status"], d["path_mtu"], d["largest_payload"])
            for d in pair["directions"]] == [(0, 1, "ok", 9000, 8972), (1, 0, "ok", 9000, 8972)]
    assert report["mtu"]["mismatches"] == []
    # gloo ran over the veth pair: the all-reduce crossed the namespaces.
    assert report["allreduce"][0]["busbw_bytes_per_s"] > 0


# ---------------------------------------------------------------------------------------------
# The halving test


HALVING = [sys.executable, "-m", "zerowait.bench_net", "--ranks", "2", "--sizes", "4K",
           "--iters", "1", "--warmup", "0", "--no-mtu-probe", "--halving", "--batch-size", "4",
           "--json"]


@needs_torch
def test_halving_finds_slow_input():
    # Each batch's input costs 4 x 20 ms on one worker, against 10 ms of compute.
    report = report_of(run(HALVING + ["--steps", "6", "--sample-ms", "20", "--workers", "1",
                                      "--compute-ms", "10", "--grad-bytes", "64K"]))
    h = report["halving"]
    assert set(h["step_seconds"]) == {"configured", "input_removed", "allreduce_removed"}
    assert all(s > 0 for s in h["step_seconds"].values())
    assert h["verdict"] == "input-bound", h
    assert h["gain"]["input_removed"] > h["threshold"]


@needs_torch
def test_halving_does_not_blame_free_input():
    # Free input (no workers, no cost per sample), no compute and 16 MiB of gradients: removing
    # the input cannot shorten the step by more than noise; removing the all-reduce can (about
    # half the step here). Steps of ~40 ms vary by tens of percent on a loaded machine: more
    # steps average that out.
    report = report_of(run(HALVING + ["--steps", "15", "--sample-ms", "0", "--workers", "0",
                                      "--compute-ms", "0", "--grad-bytes", "16M"]))
    h = report["halving"]
    assert h["verdict"] in ("compute-bound", "communication-bound"), h
    assert h["model_bytes"] == 16 << 20


# ---------------------------------------------------------------------------------------------
# Rules that need no processes


def test_verdict_follows_the_largest_gain_past_the_threshold():
    assert _net_halving.halving_verdict({"input_removed": 0.5, "allreduce_removed": 0.2})[0] == (
        "input-bound")
    assert _net_halving.halving_verdict({"input_removed": 0.05, "allreduce_removed": 0.3})[0] == (
        "communication-bound")
    assert _net_halving.halving_verdict({"input_removed": 0.08, "allreduce_removed": -0.1})[0] == (
        "compute-bound")


def test_allreduce_time_is_interpolated_between_sizes():
    rows = [{"bytes": 1 << 10, "seconds_per_op": 1e-4}, {"bytes": 1 << 20, "seconds_per_op": 1e-2}]
    assert bench_net.allreduce_seconds(rows, 1 << 20) == (1e-2, "measured")
    seconds, how = bench_net.allreduce_seconds(rows, 1 << 15)  # halfway in log space
    assert how == "interpolated" and seconds == pytest.approx(1e-3)
    assert bench_net.allreduce_seconds(rows, 1 << 22) == (pytest.approx(4e-2), "extrapolated")
    assert bench_net.bus_bandwidth(1.0, 8) == pytest.approx(2 * 7 / 8)
