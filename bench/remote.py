#!/usr/bin/env python3
"""Remote-data benchmark: zerowait.Loader over s3:// against the streaming loaders, in one run.

The peers are LitData, MosaicML Streaming, WebDataset and s3torchconnector, all reading through
one latency proxy.

One data set (N samples: random bytes of --min-bytes..--max-bytes and an integer label), written
once as WebDataset tar shards and, from those tars, in every other format with the same shard
size (--shard-mb, 64 MB: MosaicML's default size_limit): zerowait shards (`zerowait pack`),
LitData's optimized chunks (`litdata.optimize`), MosaicML MDS (`MDSWriter`). A real S3 server
(Ceph RADOS Gateway, tests/s3/rgw.sh) holds them in one bucket; zerowait's shards go up with
`zerowait pack TARS -o s3://...` (byte-identical to the local pack), the others with boto3,
straight to the server. Between the readers and the server sits build/zw_fault_proxy (or
$ZEROWAIT_FAULT_PROXY), which adds --latencies milliseconds before forwarding each request; every
reader's endpoint is the proxy, so every row pays the same latency per request.

At each latency, every row runs in a process of its own (remote_rows.py TASK SPEC) and reads the
whole data set: a cold epoch, then warm epochs (at least --warm-epochs, and more until they add
up to --warm-seconds):

- zerowait s3:// + cache_dir: zerowait.Loader("s3://bucket/zw/", cache_dir=EMPTY DIR): epoch 0
  is cold (nothing cached; its time includes opening the dataset: manifest, shard indexes), the
  next epochs are warm (served from the node-local cache).
- zerowait s3:// WebDataset tars + cache_dir: zerowait.Loader over the tars the WebDataset and
  s3torchconnector rows read (a brace list of s3:// URLs), read in place: a tar has no index, so
  Loader() scans each one, and through the cache that scan is the download; warm epochs read the
  cache. Against the fastest of those two rows, on the same objects (information).
- zerowait local (the reference): the same loader options over the local copy of the shards,
  read from the page cache (the files were just written): a warm-up epoch, then the epochs.
- S3 GET limit (information): one GET per zerowait shard, all at once, with curl through the
  proxy: what the server and proxy deliver on this machine.
- LitData: StreamingDataset("s3://bucket/litdata", cache_dir=EMPTY DIR, shuffle=True,
  batch_decode="all") in a StreamingDataLoader: epoch 0 downloads the chunks (cold), later
  epochs read the cache (warm).
- MosaicML Streaming: StreamingDataset(remote="s3://bucket/mds", local=EMPTY DIR, shuffle=True)
  in a DataLoader: the same, cold then warm.
- WebDataset over HTTP: presigned URLs of the tars through the proxy, read by webdataset's http
  handler (curl), with its cache_dir (empty at the start): cold, then warm.
- s3torchconnector: S3IterableDataset.from_prefix over the tars (force_path_style, endpoint =
  the proxy), objects streamed into WebDataset's tar reader; it has no cache, so its "warm"
  epochs read S3 again.

Why the comparison is fair: every row reads the same samples (the same bytes, in shards of the
same size) from the same server through the same proxy, within minutes of each other, and only
ratios measured in the same run are judged. Every row uses --workers (2, this machine's cores)
workers: zerowait threads=2, the peers DataLoader(num_workers=2, persistent_workers=True, so
their later epochs do not pay worker start-up), the same --batch-size, and each library's own
I/O concurrency and download defaults. zerowait's shuffle window is --window-mb (32 MB): the
loader keeps about two windows of blocks in memory, and a window as large as the data set would
serve warm epochs from the loader's memory instead of the cache. Every row shuffles, each the way it does by default for
streamed data (zerowait shuffle="block", the others their shard/chunk shuffle plus a buffer or
their default algorithm). The consumer touches nothing; the peers return each batch as a list of
bytes plus a label tensor, zerowait as one flat tensor plus offsets. Process start-up and
imports are not timed; a cold epoch's time starts before the dataset object is made. The warm
figure of every row is its warm epochs together (samples over seconds), so a row that runs more
of them (zerowait's take a tenth of a second) gains nothing by it. Where a peer needed help to
work, or to run at its best, it got it (remote_rows.py says where and why: LitData's
batch_decode and allow_http, MosaicML's boto3 client reset before the workers fork).

Goals (PASS/FAIL): zerowait warm / local >= 0.90 at every latency; zerowait cold at 50 ms /
local >= 0.50; zerowait / the fastest peer >= 1, cold and warm, at every latency.
"""

import argparse
import json
import os
import random
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import common
import remote_rows
from common import MB
from remote_rows import log

GB = 1e9
BUCKET = "zerowait-bench"

# The peers' virtual environments under --out/venvs, made on first use. Pinned: the versions
# measured. MosaicML Streaming pins numpy < 2.2 and imports torchvision, which PyPI builds only
# for a CUDA torch here: hence its own venv with the torch/torchvision pair on this machine's disk.
VENVS = {
    "peers": {"packages": ["torch==2.13.0", "litdata==0.2.76", "webdataset==1.0.2",
                           "s3torchconnector==1.5.0", "boto3==1.44.8"],
              "imports": "litdata, webdataset, s3torchconnector, boto3",
              "size": "about 1.1 GB (torch 2.13.0 CPU, from this machine's disk)"},
    "streaming": {"packages": ["torch==2.14.1", "torchvision==0.29.1",
                               "mosaicml-streaming==0.13.0", "boto3==1.44.8"],
                  "imports": "streaming, boto3",
                  "size": "about 6.3 GB (a CUDA torch 2.14.1 + torchvision 0.29.1, the pair "
                          "PyPI's torchvision imports beside, from this machine's disk)"},
}

# --rows names: (label in the table, venv or "zerowait", remote_rows task, format it reads).
ROWS = {
    "zerowait": ("zerowait s3:// + cache_dir", "zerowait", "zerowait", "zw"),
    "zerowait-tar": ("zerowait s3:// WebDataset tars + cache_dir", "zerowait", "zerowait_tars",
                     "wds"),
    "litdata": ("LitData StreamingDataset s3://", "peers", "litdata", "litdata"),
    "mds": ("MosaicML Streaming (MDS) s3://", "streaming", "mds", "mds"),
    "webdataset": ("WebDataset http (curl) + cache_dir", "peers", "webdataset", "wds"),
    "s3torchconnector": ("s3torchconnector S3IterableDataset", "peers", "s3torchconnector",
                         "wds"),
}
LOCAL = ("zerowait local shards (reference)", "zerowait", "local", "zw")
GET_LIMIT = ("S3 GET limit: curl, all shards at once",)
ZEROWAIT_ROWS = ["zerowait", "zerowait-tar"]
PEERS = [name for name in ROWS if name not in ZEROWAIT_ROWS]


# ---- interpreters --------------------------------------------------------------------------------

def python_probe(python, code):
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return result.returncode == 0, (result.stdout + result.stderr).strip()


def ensure_venv(out, name, allow_install):
    """The python of venv `name` under out/venvs, made and filled on first use. Returns (python,
    None) or (None, why not)."""
    venv = out / "venvs" / name
    spec = VENVS[name]
    python = venv / "bin" / "python"
    stamp = venv / "zerowait-bench-packages.json"
    if python.exists() and stamp.is_file() and json.loads(stamp.read_text()) == spec["packages"]:
        ok, message = python_probe(str(python), f"import {spec['imports']}")
        if ok:
            return str(python), None
        log(f"{venv}: import {spec['imports']} fails ({message.splitlines()[-1]}); reinstalling")
    if not allow_install:
        return None, f"no venv at {venv} (--no-install given)"
    log(f"creating {venv} for the {name} rows (first run only): {' '.join(spec['packages'])}; "
        f"{spec['size']}; a few minutes. pip's output: {venv}.install.log")
    start = time.perf_counter()
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{venv}.install.log", "w") as install_log:
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(python), "-m", "pip", "install", *spec["packages"]]]
        for cmd in steps:
            install_log.write(f"$ {' '.join(cmd)}\n")
            install_log.flush()
            code = subprocess.run(cmd, stdout=install_log, stderr=subprocess.STDOUT,
                                  check=False).returncode
            if code != 0:
                tail = Path(f"{venv}.install.log").read_text().strip().splitlines()[-1:]
                return None, (f"installing {name} failed (exit {code}: {' '.join(tail)[:200]}; "
                              f"see {venv}.install.log)")
    ok, message = python_probe(str(python), f"import {spec['imports']}")
    if not ok:
        return None, f"import {spec['imports']} fails in {venv}: {message.splitlines()[-1]}"
    stamp.write_text(json.dumps(spec["packages"]))
    log(f"{venv} ready in {time.perf_counter() - start:.0f} s")
    return str(python), None


# ---- processes -----------------------------------------------------------------------------------

def run_task(python, task, spec, env=None, timeout=None):
    """Runs remote_rows.py TASK SPEC in a session of its own (so its DataLoader workers can be
    ended with it); its stderr is passed through. Returns (result, None) or (None, why)."""
    cmd = [python, str(Path(remote_rows.__file__).resolve()), task, json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    tail = []

    def relay():
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line.rstrip())
            del tail[:-200]

    out = []
    threads = [threading.Thread(target=relay, daemon=True),
               threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return None, f"no result after {timeout} s (ended)"
    except BaseException:
        kill_group(proc)
        raise
    for thread in threads:
        thread.join(5)
    out = "".join(out)
    if proc.returncode != 0:
        how = (f"signal {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"exit code {proc.returncode}")
        return None, f"{how}: {last_error(tail)[:200]}"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        return None, "printed no result"
    return json.loads(lines[-1]), None


def last_error(lines):
    """The last line of `lines` that names an exception (a traceback's last line), else the last
    line that is not blank."""
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b", line.strip()):
            return line.strip()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def kill_group(proc):
    """Ends a process started with start_new_session=True and everything it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class S3Server:
    """tests/s3/rgw.sh on DIR: started on enter, stopped (and DIR removed) on exit, whatever
    happened. `env` holds its AWS_* variables."""

    def __init__(self, folder, memstore_bytes):
        self.dir = folder
        self.memstore_bytes = memstore_bytes
        self.script = common.REPO / "tests" / "s3" / "rgw.sh"
        self.env = {}

    def __enter__(self):
        self.stop()  # a server left by a run that was killed
        log(f"starting the S3 server (Ceph RGW, {self.memstore_bytes / GB:.1f} GB of memstore) "
            f"in {self.dir}")
        env = dict(os.environ, RGW_MEMSTORE_BYTES=str(self.memstore_bytes))
        result = subprocess.run(["bash", str(self.script), "start", str(self.dir)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                check=False)
        if result.returncode != 0:
            self.stop()
            sys.exit(f"bench: {self.script} start failed:\n{result.stderr.strip()}")
        for line in (self.dir / "env").read_text().splitlines():
            key, _, value = line.partition("=")
            self.env[key] = value
        return self

    def stop(self):
        subprocess.run(["bash", str(self.script), "stop", str(self.dir)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    def __exit__(self, *exc):
        log("stopping the S3 server")
        self.stop()

    def curl(self, endpoint, path, output, *extra):
        """A curl command for a request signed with curl's own SigV4 (the parent runs on the
        standard library alone); its body goes to `output` ("-": stdout)."""
        env = self.env
        return ["curl", "-sS", "-o", output, "--aws-sigv4", f"aws:amz:{env['AWS_REGION']}:s3",
                "--user", f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}",
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", *extra, f"{endpoint}/{path}"]

    def create_bucket(self, bucket):
        code = common.run(self.curl(self.env["AWS_ENDPOINT_URL"], bucket, "/dev/null",
                                    "-X", "PUT", "-w", "%{http_code}")).strip()
        if code not in ("200", "409"):
            sys.exit(f"bench: creating bucket {bucket} answered HTTP {code}")


class Proxy:
    """zw_fault_proxy --upstream URL --latency-ms MS: started on enter (its URL read from its
    first line of stdout), ended with SIGTERM on exit."""

    def __init__(self, binary, upstream, latency_ms, log_path):
        # --log-requests: every request with its begin and end times, in log_path at exit.
        self.cmd = [binary, "--upstream", upstream, "--latency-ms", str(latency_ms),
                    "--log-requests"]
        self.log_path = log_path
        self.proc = None
        self.url = None

    def __enter__(self):
        with open(self.log_path, "w") as proxy_log:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=proxy_log,
                                         text=True, start_new_session=True)
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout=15)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith("http://"):
            self.__exit__()
            sys.exit(f"bench: {' '.join(self.cmd)} printed no URL in 15 s (got {line!r}); "
                     f"its stderr is in {self.log_path}")
        self.url = line.rstrip("/")
        return self

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                kill_group(self.proc)


def find_proxy():
    return common.find_binary("ZEROWAIT_FAULT_PROXY", ["build/zw_fault_proxy"],
                              "latency proxy (zw_fault_proxy)")


# ---- the data set --------------------------------------------------------------------------------

def data_params(args):
    return {"samples": args.samples, "min_bytes": args.min_bytes, "max_bytes": args.max_bytes,
            "seed": args.seed, "shard_bytes": args.shard_mb * 1_000_000, "labels": 1000}


def write_tars(folder, params):
    """The WebDataset tar shards: sample KEY is KEY.bin (random bytes) + KEY.cls (the label in
    decimal); a shard is closed once it holds shard_bytes. Deterministic from the seed."""
    rng = random.Random(params["seed"])
    folder.mkdir(parents=True)
    shard, tar, size = 0, None, 0
    for i in range(params["samples"]):
        if tar is None:
            tar = tarfile.open(folder / f"shard-{shard:06d}.tar", "w", format=tarfile.USTAR_FORMAT)
        payload = rng.randbytes(rng.randint(params["min_bytes"], params["max_bytes"]))
        label = str(rng.randrange(params["labels"])).encode()
        for field, data in (("bin", payload), ("cls", label)):
            info = tarfile.TarInfo(f"s{i:08d}.{field}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, _BytesReader(data))
            size += 512 + (len(data) + 511) // 512 * 512
        if size >= params["shard_bytes"]:
            tar.close()
            shard, tar, size = shard + 1, None, 0
    if tar is not None:
        tar.close()


class _BytesReader:
    def __init__(self, data):
        self.view, self.pos = memoryview(data), 0

    def read(self, n=-1):
        end = len(self.view) if n < 0 else self.pos + n
        chunk = bytes(self.view[self.pos:end])
        self.pos += len(chunk)
        return chunk


class DataSet:
    """The formats on local disk under out/remote-N/, each remade when its stamp (the data
    parameters) differs or is missing."""

    def __init__(self, out, args):
        self.params = data_params(args)
        self.root = out / f"remote-{args.samples}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.tars_dir = self.root / "wds"
        self.zw_dir = self.root / "zw"
        self.notes = {}

    def tars(self):
        return common.regular_files(self.tars_dir)

    def make(self, fmt, writer):
        """Calls writer(folder) unless folder holds `fmt` made from these parameters."""
        folder = self.root / fmt
        stamp = self.root / f"{fmt}.params.json"
        if common.stamp_matches(folder, stamp, self.params):
            return True
        stamp.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        log(f"writing {fmt} into {folder}")
        start = time.perf_counter()
        if writer(folder) is False:
            return False
        stamp.write_text(json.dumps(self.params))
        log(f"  {fmt} written in {time.perf_counter() - start:.1f} s")
        return True

    def prepare(self, zerowait, pythons, wanted_formats):
        self.make("wds", lambda folder: write_tars(folder, self.params))
        shard = str(self.params["shard_bytes"])
        self.make("zw", lambda folder: common.run(
            [zerowait, "pack", *self.tars(), "-o", str(folder), "--shard-size", shard]))
        for fmt, venv, task in (("litdata", "peers", "write_litdata"),
                                ("mds", "streaming", "write_mds")):
            if fmt in wanted_formats and pythons.get(venv):
                self.make(fmt, lambda folder, t=task, v=venv: self.write_with(pythons[v], t,
                                                                              folder, fmt))

    def write_with(self, python, task, folder, fmt):
        spec = {"tars": self.tars(), "out": str(folder),
                "shard_bytes": self.params["shard_bytes"]}
        result, error = run_task(python, task, spec)
        if error:
            self.notes[fmt] = f"writing {fmt} failed: {error}"
            log(self.notes[fmt])
            return False
        return True

    def has(self, fmt):
        return common.stamp_matches(self.root / fmt, self.root / f"{fmt}.params.json",
                                    self.params)

    def payload_bytes(self):
        return sum(len(payload) for _, payload, _ in remote_rows.tar_samples(self.tars()))

    def size(self, fmt):
        return common.total_bytes(common.regular_files(self.root / fmt))


# ==== the run: prepare, start the server, measure at each latency, report =========================

class RemoteBench:
    """One run: the interpreters, the data set, the results of every (latency, row)."""

    def __init__(self, args):
        self.args = args
        self.started = time.perf_counter()
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.zerowait = common.find_zerowait()
        self.proxy = find_proxy()
        self.rows = ["zerowait", *[r for r in ROWS if r != "zerowait" and r in args.rows]]
        self.skipped = {}   # row -> why it does not run at all
        self.results = {}   # (latency, row) -> the row task's result, or {"error": why}
        self.pythons = {"zerowait": args.python or self.default_python()}
        venvs = {ROWS[r][1] for r in self.rows} - {"zerowait"}
        if not venvs and any(ROWS[r][3] != "zw" for r in self.rows):
            venvs.add("peers")  # its boto3 uploads the formats zerowait pack does not write
        for venv in sorted(venvs):
            python, why = ensure_venv(self.out, venv, not args.no_install)
            self.pythons[venv] = python
            for row in self.rows:
                if ROWS[row][1] == venv and why:
                    self.skipped[row] = why
                    log(f"row {row} will be skipped: {why}")
        self.data = DataSet(self.out, args)
        self.data.prepare(self.zerowait, self.pythons,
                          {ROWS[r][3] for r in self.rows if r not in self.skipped})
        for row in self.rows:
            fmt = ROWS[row][3]
            if row not in self.skipped and not self.data.has(fmt):
                self.skipped[row] = self.data.notes.get(fmt, f"no {fmt} data")
        self.payload = self.data.payload_bytes()
        self.cache_root = self.data.root / "cache"

    @staticmethod
    def default_python():
        venv_python = common.REPO / ".venv" / "bin" / "python"
        return str(venv_python) if venv_python.exists() else sys.executable

    def uploader(self):
        """An interpreter with boto3: the peers' venv, else MosaicML's."""
        return self.pythons.get("peers") or self.pythons.get("streaming")

    def memstore_bytes(self):
        if os.environ.get("RGW_MEMSTORE_BYTES"):
            return int(os.environ["RGW_MEMSTORE_BYTES"])
        formats = sum(self.data.size(f) for f in ("wds", "zw", "litdata", "mds")
                      if self.data.has(f))
        return max(4 << 30, 2 * formats)

    def upload(self, server):
        """zerowait's shards with `zerowait pack -o s3://` (hash-named prefixes, manifest last),
        the other formats with boto3; both straight to the server."""
        server.create_bucket(BUCKET)
        env = dict(os.environ, **server.env)
        log(f"packing {len(self.data.tars())} tars straight to s3://{BUCKET}/zw")
        start = time.perf_counter()
        result = subprocess.run([self.zerowait, "pack", *self.data.tars(), "-o",
                                 f"s3://{BUCKET}/zw", "--shard-size",
                                 str(self.data.params["shard_bytes"]), "--overwrite"],
                                env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            sys.exit(f"bench: zerowait pack to s3:// failed:\n{result.stderr.strip()}")
        log(f"  done in {time.perf_counter() - start:.1f} s")
        folders = {str(self.data.root / fmt): fmt for fmt in ("wds", "litdata", "mds")
                   if any(ROWS[r][3] == fmt for r in self.rows if r not in self.skipped)}
        if not folders:
            return
        log(f"uploading {', '.join(folders.values())} with boto3")
        result, error = run_task(self.uploader(), "upload",
                                 {"endpoint": server.env["AWS_ENDPOINT_URL"], "bucket": BUCKET,
                                  "folders": folders}, env=env)
        if error:
            sys.exit(f"bench: the upload failed: {error}")
        log(f"  {result['objects']} objects, {result['bytes'] / MB:.0f} MB in "
            f"{result['seconds']:.1f} s")

    def spec(self, row, proxy_url, region):
        args = self.args
        spec = {"batch_size": args.batch_size, "workers": args.workers,
                "warm_epochs": args.warm_epochs, "warm_seconds": args.warm_seconds,
                "shuffle_buffer": args.shuffle_buffer,
                "shuffle": "block", "window_bytes": args.window_mb << 20, "bucket": BUCKET, "endpoint": proxy_url, "region": region,
                "cache_dir": str(self.cache_root / row)}
        fmt = ROWS[row][3] if row in ROWS else "zw"
        spec["url"] = f"s3://{BUCKET}/{fmt}/"
        spec["local"] = str(self.data.zw_dir)
        spec["keys"] = [f"wds/{Path(t).name}" for t in self.data.tars()]
        return spec

    def row_env(self, server, proxy_url):
        env = dict(os.environ, **server.env)
        env.pop("AWS_ENDPOINT_URL_S3", None)
        # S3_ENDPOINT_URL: MosaicML Streaming's name for it.
        env.update(AWS_ENDPOINT_URL=proxy_url, S3_ENDPOINT_URL=proxy_url,
                   AWS_EC2_METADATA_DISABLED="true", no_proxy="127.0.0.1,localhost",
                   NO_PROXY="127.0.0.1,localhost")
        return env

    def measure_get_limit(self, server, proxy_url):
        """What the server and proxy deliver: every zerowait shard with one GET, all at once
        (curl, through the proxy), best of two. The keys come from the manifest in the bucket."""
        def curl(key, output):
            return server.curl(proxy_url, f"{BUCKET}/zw/{key}", output)

        manifest = json.loads(common.run(curl("manifest.json", "-")))
        keys = [shard["path"] for shard in manifest["shards"]]
        best = None
        for _ in range(2):
            start = time.perf_counter()
            procs = [subprocess.Popen(curl(key, "/dev/null"), stderr=subprocess.PIPE, text=True)
                     for key in keys]
            errors = [p.communicate()[1].strip() for p in procs if p.wait() != 0]
            seconds = time.perf_counter() - start
            if errors:
                return {"error": f"curl: {errors[0]}"}
            best = seconds if best is None else min(best, seconds)
        return {"epochs": [{"seconds": best, "samples": manifest["samples"],
                            "bytes": manifest["bytes"], "batches": len(keys)}]}

    def measure(self, server, latency):
        log(f"---- {latency} ms added to every request ----")
        with Proxy(self.proxy, server.env["AWS_ENDPOINT_URL"], latency,
                   self.data.root / f"proxy-{latency}ms.log") as proxy:
            env = self.row_env(server, proxy.url)
            log(f"({latency} ms) {GET_LIMIT[0]}")
            self.results[(latency, "get")] = self.measure_get_limit(server, proxy.url)
            for row in ["local", *self.rows]:
                if row in self.skipped:
                    continue
                label, venv, task, _ = LOCAL if row == "local" else ROWS[row]
                log(f"({latency} ms) {label}")
                result, error = run_task(self.pythons[venv], task,
                                         self.spec(row, proxy.url, server.env["AWS_REGION"]),
                                         env=env, timeout=self.args.row_timeout)
                if error:
                    log(f"({latency} ms) {label} failed: {error}")
                    result = {"error": error}
                self.results[(latency, row)] = result
        shutil.rmtree(self.cache_root, ignore_errors=True)

    def run(self):
        with S3Server(self.data.root / "s3", self.memstore_bytes()) as server:
            self.upload(server)
            for latency in self.args.latencies:
                self.measure(server, latency)


# ---- the table -----------------------------------------------------------------------------------

def epoch_row(epoch):
    if not epoch or not epoch.get("seconds"):
        return None
    n = epoch.get("epochs", 1)
    return dict(epoch, epochs=n, seconds_per_epoch=epoch["seconds"] / n,
                samples_per_s=epoch["samples"] / epoch["seconds"],
                mb_per_s=epoch["bytes"] / epoch["seconds"] / MB)


def cold_warm(result):
    """(cold epoch, warm epochs) of a row's result, as table rows (None where missing): the
    warm figure is every warm epoch together (their samples, bytes and seconds added up)."""
    epochs = (result or {}).get("epochs") or []
    warm = None
    if len(epochs) > 1:
        warm = {key: sum(e[key] for e in epochs[1:])
                for key in ("seconds", "samples", "bytes", "batches")}
        warm["epochs"] = len(epochs) - 1
    return epoch_row(epochs[0] if epochs else None), epoch_row(warm)


def table_lines(bench):
    """One line per (latency, row, epoch kind), with its ratios to the local reference and to
    zerowait at the same latency."""
    lines = []
    for latency in bench.args.latencies:
        _, local = cold_warm(bench.results.get((latency, "local")))
        zw = dict(zip(("cold", "warm"), cold_warm(bench.results.get((latency, "zerowait")))))
        for row in ["local", "get", *bench.rows]:
            label = {"local": LOCAL[0], "get": GET_LIMIT[0]}.get(row) or ROWS[row][0]
            base = {"latency_ms": latency, "row": row, "name": label}
            if row in bench.skipped:
                lines.append(dict(base, kind="-", skipped=bench.skipped[row]))
                continue
            result = bench.results.get((latency, row)) or {"error": "not run"}
            if "error" in result:
                lines.append(dict(base, kind="-", skipped=f"failed: {result['error']}"))
                continue
            cold, warm = cold_warm(result)
            kinds = {"local": [("warm", warm)], "get": [("get", cold)]}.get(
                row, [("cold", cold), ("warm", warm)])
            for kind, epoch in kinds:
                if epoch is None:
                    continue
                line = dict(base, kind=kind, **epoch)
                if local:
                    line["vs_local"] = epoch["samples_per_s"] / local["samples_per_s"]
                if row in PEERS and zw.get(kind):
                    line["zerowait_vs"] = zw[kind]["samples_per_s"] / epoch["samples_per_s"]
                lines.append(line)
    return lines


def fastest_line(find, latency, kind, rows):
    """The table line of the fastest of `rows` at `latency` for `kind` of epoch, or None."""
    lines = [find[(latency, row, kind)] for row in rows if (latency, row, kind) in find]
    return max(lines, key=lambda l: l["samples_per_s"], default=None)


def judge(bench, lines):
    """The goals, per latency: zerowait warm / local, zerowait cold / local (judged at 50 ms),
    zerowait / the fastest peer, cold and warm."""
    from loader import ratio  # the benchmarks' PASS/FAIL/SKIP/info ratio
    find = {(l["latency_ms"], l["row"], l["kind"]): l for l in lines if "seconds" in l}
    ratios = []
    for latency in bench.args.latencies:
        for kind, goal in (("warm", 0.90), ("cold", 0.50 if latency == 50 else None)):
            line = find.get((latency, "zerowait", kind))
            ratios.append(ratio(f"zerowait {kind} / local, {latency} ms",
                                line.get("vs_local") if line else None, goal, True))
        cold, limit = find.get((latency, "zerowait", "cold")), find.get((latency, "get", "get"))
        ratios.append(ratio(f"zerowait cold / curl GET limit, {latency} ms",
                            cold["samples_per_s"] / limit["samples_per_s"]
                            if cold and limit else None, None, True))
        for kind in ("cold", "warm"):
            fastest = fastest_line(find, latency, kind, [p for p in bench.rows if p in PEERS])
            value = fastest.get("zerowait_vs") if fastest else None
            note = f"fastest peer: {fastest['name']}" if fastest else "no peer measured"
            if fastest and fastest["row"] == "s3torchconnector" and kind == "warm":
                note += " (no cache: reads S3 again)"
            ratios.append(ratio(f"zerowait / fastest peer, {kind}, {latency} ms", value, 1, True,
                                note))
        for kind in ("cold", "warm"):
            tars = find.get((latency, "zerowait-tar", kind))
            fastest = fastest_line(find, latency, kind, ["webdataset", "s3torchconnector"])
            ratios.append(ratio(f"zerowait tars / fastest peer on them, {kind}, {latency} ms",
                                tars["samples_per_s"] / fastest["samples_per_s"]
                                if tars and fastest else None, None, True,
                                f"{fastest['name']}" if fastest else "no peer measured"))
    return ratios


def notes_for(bench, lines):
    args = bench.args
    notes = [f"cold = the first epoch from an empty cache, timed from before the dataset object "
             f"is made; warm = the next epochs together (at least {args.warm_epochs}, and until "
             f"{args.warm_seconds:g} s of them); local = zerowait over the same shards on local "
             "disk (page cache warm), its epochs after a warm-up epoch, counted the same way",
             "curl GET limit = one GET per zerowait shard, all at once, through the proxy: what "
             "the server and proxy deliver on this machine (information)",
             "s3torchconnector has no local cache: its warm epochs read S3 again"]
    for (latency, row), result in bench.results.items():
        short = sorted({e["samples"] for e in result.get("epochs", [])} - {args.samples})
        if short and row != "get":
            name = {"local": LOCAL[0]}.get(row) or ROWS[row][0]
            notes.append(f"{name} at {latency} ms: epochs of {', '.join(map(str, short))} "
                         f"samples, not {args.samples}")
    return notes


def zerowait_lines(bench):
    """Below the table: where zerowait's cold epochs went, and its cache's counters."""
    out = []
    for latency, row in ((l, r) for l in bench.args.latencies for r in ZEROWAIT_ROWS):
        r = bench.results.get((latency, row)) or {}
        if not r.get("epochs"):
            continue
        cold = r["epochs"][0]
        cache = r.get("cache") or {}
        out.append(f"{row} at {latency} ms: cold epoch {cold['seconds']:.2f} s = Loader() "
                   f"{r['open_s']:.2f} s (manifest, shard indexes; tar scans) + first batch "
                   f"{cold['first_batch_s'] - r['open_s']:.2f} s + the rest; consumer waited "
                   f"{r['wait_s']:.2f} s in all epochs; cache " + ", ".join(
                       f"{k}={v}" for k, v in cache.items()
                       if k in ("hits", "misses", "waits", "prefetched", "bytes_downloaded")))
    return out


def print_table(header, lines, ratios, notes, extras=()):
    print()
    for text in header:
        print(text)
    print()
    print(f"{'latency':>7}  {'row':<38} {'epoch':<5} {'n':>3} {'s/epoch':>8} {'samples/s':>10} "
          f"{'MB/s':>8} {'/ local':>8} {'zw x':>6}")
    print("-" * 103)
    previous = None
    for l in lines:
        latency = f"{l['latency_ms']} ms" if l["latency_ms"] != previous else ""
        previous = l["latency_ms"]
        if "skipped" in l:
            print(f"{latency:>7}  {l['name']:<38} {'-':<5} skipped: {l['skipped']}")
            continue
        vs_local = f"{l['vs_local']:.2f}" if "vs_local" in l else "-"
        zw = f"{l['zerowait_vs']:.2f}" if "zerowait_vs" in l else ""
        print(f"{latency:>7}  {l['name']:<38} {l['kind']:<5} {l['epochs']:>3} "
              f"{l['seconds_per_epoch']:>8.2f} {l['samples_per_s']:>10,.0f} {l['mb_per_s']:>8,.1f} "
              f"{vs_local:>8} {zw:>6}")
    common.print_ratios(ratios, notes, extras, name_width=44)


def report(bench):
    args = bench.args
    lines = table_lines(bench)
    ratios = judge(bench, lines)
    notes = notes_for(bench, lines)
    zw_shards = len(common.shard_paths(bench.data.zw_dir))
    header = [
        f"zerowait remote-data benchmark: {args.samples} samples of {args.min_bytes:,}-"
        f"{args.max_bytes:,} random bytes + a label ({bench.payload / MB:,.0f} MB), shards of "
        f"{args.shard_mb} MB ({zw_shards} zerowait shards); batch_size {args.batch_size}, "
        f"{args.workers} workers per row; zerowait window {args.window_mb or 256} MB; Ceph RGW on 127.0.0.1 behind zw_fault_proxy "
        f"(+latency per request); {os.cpu_count()} CPUs; {time.perf_counter() - bench.started:.0f}"
        " s in all",
        "goals: zerowait warm epoch >= 0.90 x local; zerowait cold epoch at 50 ms >= 0.50 x local;"
        " zerowait faster than every peer, cold and warm",
        "columns: n = epochs timed; s/epoch = seconds per epoch; / local = samples/s over "
        "zerowait's local samples/s at the same latency; zw x = zerowait's samples/s of the same "
        "epoch kind over the row's"]
    print_table(header, lines, ratios, notes, zerowait_lines(bench))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"samples": args.samples, "payload_bytes": bench.payload,
             "params": bench.data.params, "batch_size": args.batch_size,
             "workers": args.workers, "window_mb": args.window_mb, "latencies_ms": args.latencies, "lines": lines,
             "ratios": ratios, "notes": notes, "skipped": bench.skipped,
             "results": [{"latency_ms": k[0], "row": k[1], **v}
                         for k, v in bench.results.items()]}, indent=2, default=str) + "\n")
        log(f"results written to {args.json}")
    failed = any(r["result"] == "FAIL" for r in ratios) or any(
        "skipped" in l for l in lines if l["row"] in ("local", "zerowait"))
    return 1 if args.strict and failed else 0


def parse_args():
    parser = argparse.ArgumentParser(
        prog="bench/run remote", description=__doc__.split("\n")[0],
        epilog="Rows (--rows): " + ", ".join(f"{k} = {v[0]}" for k, v in ROWS.items()) +
               f"; the reference ({LOCAL[0]}) always runs. Needs root (the S3 server). The "
               "peers' venvs are made under OUT/venvs on first use. See bench/README.md.")
    parser.add_argument("--samples", type=int, default=8000, help="samples in the data set")
    parser.add_argument("--min-bytes", type=int, default=25_000)
    parser.add_argument("--max-bytes", type=int, default=45_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shard-mb", type=int, default=64,
                        help="shard / chunk size of every format, MB (default 64)")
    parser.add_argument("--latencies", default="0,5,50",
                        help="milliseconds the proxy adds per request, comma-separated")
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"comma-separated subset of {','.join(ROWS)} (zerowait always runs)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--window-mb", type=int, default=32,
                        help="zerowait's shuffle window (window_bytes), MB; the loader keeps about "
                             "two windows of blocks in memory. The default keeps them well under "
                             "the data set, so warm epochs read the node-local cache (and the "
                             "reference its files), not blocks still in the loader's memory; 0 = "
                             "the library's default (256)")
    parser.add_argument("--workers", type=int, default=2,
                        help="zerowait threads / DataLoader workers of every row (default 2)")
    parser.add_argument("--warm-epochs", type=int, default=2,
                        help="warm epochs after the cold one, at least (default 2)")
    parser.add_argument("--warm-seconds", type=float, default=2.0,
                        help="and more warm epochs until they add up to this (default 2 s; "
                             "at most 50 epochs); the warm figure is their total")
    parser.add_argument("--shuffle-buffer", type=int, default=1000,
                        help="WebDataset / s3torchconnector sample shuffle buffer")
    parser.add_argument("--row-timeout", type=int, default=300,
                        help="seconds a row may take before it is ended and reported failed")
    parser.add_argument("--out", default=str(common.DEFAULT_OUT),
                        help="work directory: data set, caches, venvs (default bench/out)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--python", default=os.environ.get("ZEROWAIT_PYTHON"),
                        help="interpreter of the zerowait rows (default $ZEROWAIT_PYTHON, "
                             "else .venv/bin/python)")
    parser.add_argument("--no-install", action="store_true",
                        help="do not create the peers' venvs; rows without one are skipped")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a goal is missed or a zerowait row failed")
    args = parser.parse_args()
    try:
        args.latencies = [int(x) for x in args.latencies.split(",") if x.strip()]
    except ValueError:
        parser.error("--latencies takes comma-separated whole milliseconds, e.g. 0,5,50")
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if any(r not in ROWS for r in args.rows):
        parser.error(f"--rows takes a comma-separated subset of {','.join(ROWS)}")
    if not args.latencies or min(args.latencies) < 0:
        parser.error("--latencies needs at least one value >= 0")
    if args.window_mb < 0:
        parser.error("--window-mb must be >= 0")
    if min(args.samples, args.batch_size, args.workers, args.warm_epochs, args.shard_mb) < 1:
        parser.error("--samples, --batch-size, --workers, --warm-epochs, --shard-mb must be >= 1")
    if not 0 < args.min_bytes <= args.max_bytes:
        parser.error("need 0 < --min-bytes <= --max-bytes")
    return args


def main():
    args = parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: the S3 server (tests/s3/rgw.sh) needs root")
    # SIGTERM ends the run as Ctrl-C does: through the `finally`s and `with`s that stop the
    # proxy, the row in progress and the S3 server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bench = RemoteBench(args)
    bench.run()
    return report(bench)


if __name__ == "__main__":
    sys.exit(main())
