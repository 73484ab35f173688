"""Helpers shared by the Python tests: real trees of files on disk and their expected contents."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import zerowait


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file under root, by '/'-separated relative path."""
    files = (p for p in sorted(root.rglob("*")) if p.is_file())
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in files}


def write_random_tree(root: Path, samples: int, seed: int) -> dict[str, dict[str, bytes]]:
    """Writes a WebDataset-style tree (files grouped by basename) and returns key -> fields.

    Two sub-directories, fields "bin" (random bytes, sometimes empty), "meta.json" (a dotted
    field name) and, every fifth sample, "zeros" (12 KiB of zero bytes, which the shard writer
    stores sparsely).
    """
    rng = random.Random(seed)
    expected: dict[str, dict[str, bytes]] = {}
    for i in range(samples):
        key = f"part{i % 2}/sample_{i:04d}"
        fields = {
            "bin": rng.randbytes(0 if i == 3 else rng.randint(1, 6000)),
            "meta.json": f'{{"index": {i}, "seed": {seed}}}'.encode(),
        }
        if i % 5 == 0:
            fields["zeros"] = bytes(12 * 1024)
        for name, data in fields.items():
            path = root / f"{key}.{name}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        expected[key] = fields
    return expected


def dataset_contents(ds: zerowait.Dataset) -> dict[str, dict[str, bytes]]:
    """key -> fields for every sample of ds, read through the public API."""
    return {ds.key(i): ds[i] for i in range(len(ds))}


def flip_byte(path, offset: int, mask: int = 0xFF) -> None:
    """Damages one byte of a file in place: the byte at `offset` XOR `mask`."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for MASTER_PORT). Drawn below the
    kernel's ephemeral range (net.ipv4.ip_local_port_range), where the outgoing connections of
    tests running beside this one (gloo opens many) take their local ports: a port bound to 0
    and released came from that range, and another process could take it before the rank
    listening on it started (EADDRINUSE)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low = max(1024, min(20000, ephemeral_low - 4096))
    for _ in range(200):
        port = random.randrange(low, ephemeral_low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in [{low}, {ephemeral_low}) on 127.0.0.1")


def start_ranks(script: Path, args: list, world_size: int) -> list:
    """Starts `python SCRIPT ARGS...` as the ranks of a job on this machine (RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT in their environment), stdout and stderr piped as text."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world_size))
    return [subprocess.Popen([sys.executable, str(script), *map(str, args)],
                             env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for rank in range(world_size)]


def batches_and_errors(loader, error_type) -> tuple[list, list]:
    """The rest of the loader's epoch, next() by next(): the batches, and the errors of
    `error_type` raised on the way (iteration goes on after each, as on_corrupt="raise" says)."""
    batches, errors = [], []
    while True:
        try:
            batch = loader.next()
        except error_type as e:
            errors.append(e)
            continue
        if batch is None:
            return batches, errors
        batches.append(batch)


def run_rank_reports(script: Path, mode: str, world_size: int, directory: Path,
                     out: Path) -> list:
    """Runs `python SCRIPT MODE DIRECTORY OUT` as `world_size` ranks (start_ranks) and returns
    the report each rank wrote to OUT/rank-R.json (None for a rank that wrote none); every rank
    must exit 0 unless MODE is "kill"."""
    out.mkdir(parents=True, exist_ok=True)
    procs = start_ranks(script, [mode, directory, out], world_size)
    reports = []
    for rank, p in enumerate(procs):
        _, err = p.communicate(timeout=300)
        report = out / f"rank-{rank}.json"
        reports.append(json.loads(report.read_text()) if report.exists() else None)
        if mode != "kill":
            assert p.returncode == 0, f"rank {rank}:\n{err[-4000:]}"
    return reports
