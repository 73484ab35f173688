"""Loader(numa=...) on this machine's real NUMA node 0: the loader's threads run on the node's
CPUs and its batch arenas are bound to the node's memory, as /proc/self/task/*/status and
/proc/self/numa_maps show them; numa=None leaves both as they were; bad requests are ValueErrors.

On a one-node machine node 0 holds every CPU, so pinning to it is only visible against a thread
that runs on fewer: the tests restrict the creating thread to one CPU after the loader is made
and before its threads start. Threads inherit their creator's CPUs, so an unpinned loader's
threads get that one CPU, a pinned loader's the node's."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import zerowait

NODE0 = Path("/sys/devices/system/node/node0/cpulist")


def parse_cpus(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def format_cpus(cpus: set[int]) -> str:
    ordered, ranges = sorted(cpus), []
    for cpu in ordered:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def loader_threads(not_in: dict[str, str] | None = None) -> dict[str, str]:
    """Cpus_allowed_list of every thread whose name starts with "zw-", by "name (tid)".

    `not_in` leaves out threads listed there: a loader an earlier test left to the garbage
    collector may still have live threads of the same names.
    """
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            status = Path(f"/proc/self/task/{tid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the task ended meanwhile: its entry gone (ENOENT) or dead (ESRCH)
        if name.startswith("zw-") and f"{name} ({tid})" not in (not_in or {}):
            line = next(l for l in status.splitlines() if l.startswith("Cpus_allowed_list:"))
            found[f"{name} ({tid})"] = line.split(":", 1)[1].strip()
    return found


def policy_at(address: int) -> str:
    """The memory policy /proc/self/numa_maps shows for the mapping that holds `address`."""
    best, policy = -1, ""
    for line in Path("/proc/self/numa_maps").read_text().splitlines():
        start, line_policy = line.split()[:2]
        if best < int(start, 16) <= address:
            best, policy = int(start, 16), line_policy
    return policy


def address_of(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """64 samples of 8 KiB: a batch of 32 has a 256 KiB "bin" column, a view of its arena."""
    path = tmp_path_factory.mktemp("numa-data") / "ds"
    rng = np.random.default_rng(5)
    zerowait.write_dataset(({"bin": rng.bytes(8192)} for _ in range(64)), path)
    return path


@pytest.fixture()
def one_cpu_creator():
    """Restricts the calling thread to its first CPU (restored afterwards); returns that CPU."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip(f"needs a process allowed on at least 2 CPUs (has {sorted(allowed)})")
    first = min(allowed)
    yield first, allowed
    os.sched_setaffinity(0, allowed)


def needs_node0() -> set[int]:
    if not NODE0.exists():
        pytest.skip("this kernel lists no NUMA node 0 (/sys/devices/system/node)")
    return parse_cpus(NODE0.read_text())


def test_numa_0_pins_every_loader_thread_and_binds_the_arenas(dataset, one_cpu_creator):
    node_cpus = needs_node0()
    first, allowed = one_cpu_creator
    expected = format_cpus(node_cpus & allowed)
    before = loader_threads()
    with zerowait.Loader(dataset, 32, numa=0, threads=2, output="numpy") as loader:
        os.sched_setaffinity(0, {first})  # the workers start with the first next()
        batch = loader.next()
        threads = loader_threads(not_in=before)
        assert sum(name.startswith("zw-loader-") for name in threads) == 2, threads
        assert all(cpus == expected for cpus in threads.values()), (expected, threads)
        assert parse_cpus(Path("/proc/thread-self/status").read_text().split(
            "Cpus_allowed_list:")[1].splitlines()[0]) == {first}

        stats = loader.stats()["numa"]
        assert stats["requested"] == 0
        assert stats["node"] == 0
        assert stats["cpus"] == expected
        assert "node 0 as requested" in stats["reason"]
        assert stats["memory_policy"] == "bind", stats["reason"]
        column = batch["bin"]
        assert column.nbytes > 64 << 10  # a view of the arena, not a copy
        assert policy_at(address_of(column)) == "bind:0"


def test_numa_none_leaves_threads_and_memory_as_they_were(dataset, one_cpu_creator):
    first, _ = one_cpu_creator
    before = loader_threads()
    with zerowait.Loader(dataset, 32, threads=2, output="numpy") as loader:
        os.sched_setaffinity(0, {first})
        batch = loader.next()
        threads = loader_threads(not_in=before)
        assert sum(name.startswith("zw-loader-") for name in threads) == 2, threads
        assert all(cpus == str(first) for cpus in threads.values()), threads  # inherited
        unbound = np.ones(8 << 20, dtype=np.uint8)  # fresh memory of this process
        assert policy_at(address_of(batch["bin"])) == policy_at(address_of(unbound))
        assert policy_at(address_of(batch["bin"])) != "bind:0"
        assert loader.stats()["numa"] == {
            "requested": None, "node": None, "cpus": None, "memory_policy": "none",
            "reason": "not requested"}


def test_auto_without_cuda_binds_nothing_and_says_so(dataset):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch has a CUDA device: auto places the loader on its node")
    before = loader_threads()
    with zerowait.Loader(dataset, 32, numa="auto", threads=1) as loader:
        next(iter(loader))
        stats = loader.stats()["numa"]
        assert stats == {"requested": "auto", "node": None, "cpus": None,
                         "memory_policy": "none", "reason": "no CUDA device"}
        cpus = set(loader_threads(not_in=before).values())
        assert cpus == {format_cpus(os.sched_getaffinity(0))}


def test_a_node_that_does_not_exist_is_a_value_error_at_creation(dataset):
    needs_node0()
    with pytest.raises(ValueError, match=r"NUMA node 4095 does not exist; this machine has node"):
        zerowait.Loader(dataset, 32, numa=4095)
    for bad in ("yes", True, 1.5, -1):
        with pytest.raises(ValueError, match="numa|node"):
            zerowait.Loader(dataset, 32, numa=bad)


def test_threads_of_a_closed_loader_are_gone(dataset):
    """The names the tests find threads by belong to live loaders only."""
    before = loader_threads()
    with zerowait.Loader(dataset, 32, numa=0 if NODE0.exists() else None, threads=2) as loader:
        next(iter(loader))
        assert sum(name.startswith("zw-loader-") for name in loader_threads(not_in=before)) == 2
    # close() joins the threads, and pthread_join returns once the kernel clears the thread's
    # id, a moment before the exiting task leaves /proc/self/task: wait out that moment.
    deadline = time.monotonic() + 10
    while any(name.startswith("zw-loader-") for name in loader_threads(not_in=before)):
        assert time.monotonic() < deadline, loader_threads(not_in=before)
        time.sleep(0.01)
