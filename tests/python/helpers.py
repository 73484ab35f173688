"""Helpers shared by the Python tests: real trees of files on disk and their expected contents."""

from __future__ import annotations

import array
import atexit
import hashlib
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
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


def python_process(argv: list, env: dict):
    """`python ARGV...` with `env`, stdout and stderr piped as text: a Popen-like process forked
    from a zygote that has imported torch already (tests/python/zygote.py: the import costs
    about 2.5 s of CPU a process), or a plain subprocess.Popen where the zygote cannot be had or
    $ZEROWAIT_TEST_NO_ZYGOTE is set."""
    if not os.environ.get("ZEROWAIT_TEST_NO_ZYGOTE"):
        server = _zygote()
        if server is not None:
            return ZygoteProcess(server, argv, env)
    return subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


_zygote_lock = threading.Lock()
_zygote_server: list = []  # [socket path, its Popen], once started; [None] if it failed


def _zygote():
    """The socket path of this process's zygote, started on first use; None if it failed."""
    with _zygote_lock:
        if not _zygote_server:
            path = os.path.join(tempfile.mkdtemp(prefix="zw-zygote-"), "socket")
            server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py")),
                                       path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)
            ready = server.stdout.readline().strip() == "ready"
            _zygote_server[:] = [path, server] if ready else [None]
            atexit.register(server.stdin.close)  # its stdin closing ends it
        return _zygote_server[0]


class ZygoteProcess:
    """A child of the zygote with the interface of subprocess.Popen(..., stdout=PIPE,
    stderr=PIPE, text=True) that the tests use: pid, args, returncode, poll, wait, communicate,
    kill, terminate. Its exit status comes from the zygote (its parent) over the connection
    that asked for it."""

    def __init__(self, server: str, argv: list, env: dict):
        self.args = [sys.executable, *argv]
        self.returncode = None
        self._out, self._err = [], []
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(server)
        request = json.dumps({"argv": list(argv), "env": dict(env), "cwd": os.getcwd()})
        self._conn.sendmsg([request.encode() + b"\n"], [(
            socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [out_w, err_w]))])
        os.close(out_w)
        os.close(err_w)
        self._pipes = {out_r: self._out, err_r: self._err}
        self._received = b""
        self.pid = int(self._line(None))

    def _line(self, timeout):
        """The next line from the zygote; None if none came within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._received:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(64)
            except (TimeoutError, BlockingIOError):  # settimeout(0) makes recv non-blocking
                return None
            if not chunk:
                raise RuntimeError(f"the zygote ended before {self.args[1:]} did")
            self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return line.decode()

    def poll(self):
        return self.wait(timeout=0) if self.returncode is None else self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(line)
            self._conn.close()
        return self.returncode

    def communicate(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for fd in self._pipes:
                selector.register(fd, selectors.EVENT_READ)
            while self._pipes:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        self._pipes[key.fd].append(chunk)
                    else:
                        selector.unregister(key.fd)
                        os.close(key.fd)
                        del self._pipes[key.fd]
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return (b"".join(self._out).decode(errors="replace"),
                b"".join(self._err).decode(errors="replace"))

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def start_ranks(script: Path, args: list, world_size: int, attempts: int = 4) -> list:
    """Starts `python SCRIPT ARGS...` as the ranks of a job on this machine (RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT in their environment), stdout and stderr piped as text.

    Returns once rank 0's TCPStore listens on MASTER_PORT (or rank 0 has ended). A port free
    when drawn can be taken before rank 0 binds it (importing torch takes seconds on a loaded
    machine); rank 0 then dies at init_process_group with EADDRINUSE, before the job did
    anything, and the ranks are started again on another port."""
    for attempt in range(attempts):
        port = free_port()
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   WORLD_SIZE=str(world_size))
        procs = [python_process([str(script), *map(str, args)], env=dict(env, RANK=str(rank)))
                 for rank in range(world_size)]
        # Workers that coordinate through files never listen: after 120 s they are on their own.
        deadline = time.monotonic() + 120
        while (procs[0].poll() is None and not _listening(procs[0].pid, port)
               and time.monotonic() < deadline):
            time.sleep(0.05)
        if procs[0].poll() is None or procs[0].returncode == 0:
            return procs
        out, err = procs[0].communicate()
        if "EADDRINUSE" not in err or attempt == attempts - 1:
            # Not the port's fault: the caller reads rank 0's output as if it had run alone.
            procs[0] = _Ended(procs[0].args, procs[0].returncode, out, err)
            return procs
        for p in procs[1:]:
            p.kill()
            p.communicate()
    raise AssertionError("unreachable")


class _Ended:
    """A rank that has ended whose output start_ranks already read: communicate() and
    returncode as a Popen's."""

    def __init__(self, args, returncode: int, out: str, err: str):
        self.args, self.returncode, self._out, self._err = args, returncode, out, err

    def communicate(self, timeout=None):
        return self._out, self._err

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode

    def kill(self):
        pass


def _listening(pid: int, port: int) -> bool:
    """Whether process `pid` listens on TCP `port` (IPv4 or IPv6): a LISTEN socket on the port
    in /proc/net/tcp* that is one of its open files. (Connecting to rank 0's store to find out
    would be a client it does not expect; a socket of another process on the port is what
    makes rank 0 fail.)"""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{fields[9]}]")
        except OSError:
            continue
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


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


def create_bucket(s3_env: dict, name: str) -> None:
    """Creates bucket `name` on the S3 server that `s3_env` (its AWS_* settings) describes."""
    region = s3_env.get("AWS_REGION", "us-east-1")
    subprocess.run(
        ["curl", "-sS", "--fail", "--max-time", "30", "-X", "PUT",
         f"{s3_env['AWS_ENDPOINT_URL']}/{name}", "--aws-sigv4", f"aws:amz:{region}:s3",
         "--user", f"{s3_env['AWS_ACCESS_KEY_ID']}:{s3_env['AWS_SECRET_ACCESS_KEY']}",
         # RGW wants the payload's hash, which curl signs but does not add by itself.
         "-H", f"x-amz-content-sha256: {hashlib.sha256(b'').hexdigest()}"],
        check=True, timeout=60, stdin=subprocess.DEVNULL, capture_output=True)
