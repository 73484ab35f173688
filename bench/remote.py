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
  proxy, each body to /dev/null: what the server and proxy deliver on this machine.
- S3 GET limit into new files (the cold goal's reference): the same GETs, each body written to a
  new file on the file system of the rows' caches. A cold epoch through the node-local cache
  must land every byte it reads there (that is what makes the warm epochs, and the node's other
  processes, read no byte from S3), so no cached read can go faster than this; where writing
  fresh files is slower than the link (on this virtual machine it is: fresh page-cache pages are
  expensive to touch, docs/remote.md), this, not the /dev/null row, is the server's limit for
  a cache.
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
local >= 0.50; zerowait cold / the S3 GET limit into new files >= 0.80 at every latency (the
/dev/null limit beside it is information); zerowait's first batch at 50 ms (from Loader() to the
first batch) within 4 round trips (manifest, shard indexes, data, one spare) plus one cache
block (4 MiB) at the /dev/null GET limit; zerowait / the fastest peer >= 1, cold and warm, at
every latency.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import common
from common import MB
from remote_data import DataSet
from remote_procs import Proxy, S3Server, ensure_venv, find_proxy, run_task
from remote_rows import log
from remote_table import GET_FILES_LIMIT, GET_LIMIT, LOCAL, ROWS, report

BUCKET = "zerowait-bench"


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

    def measure_get_limit(self, server, proxy_url, into_files):
        """What the server and proxy deliver: every zerowait shard with one GET, all at once
        (curl, through the proxy), best of two. The keys come from the manifest in the bucket.
        `into_files`: each body goes to a new file in a folder beside the rows' caches (on their
        file system), as a cache must keep it; else to /dev/null."""
        def curl(key, output):
            return server.curl(proxy_url, f"{BUCKET}/zw/{key}", output)

        manifest = json.loads(common.run(curl("manifest.json", "-")))
        keys = [shard["path"] for shard in manifest["shards"]]
        folder = self.cache_root / "curl"
        best = None
        for _ in range(2):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            outputs = [str(folder / f"{i}.body") if into_files else "/dev/null"
                       for i in range(len(keys))]
            start = time.perf_counter()
            procs = [subprocess.Popen(curl(key, output), stderr=subprocess.PIPE, text=True)
                     for key, output in zip(keys, outputs)]
            errors = [p.communicate()[1].strip() for p in procs if p.wait() != 0]
            seconds = time.perf_counter() - start
            shutil.rmtree(folder, ignore_errors=True)
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
            for row, label, into_files in (("get", GET_LIMIT[0], False),
                                           ("get-files", GET_FILES_LIMIT[0], True)):
                log(f"({latency} ms) {label}")
                self.results[(latency, row)] = self.measure_get_limit(server, proxy.url,
                                                                      into_files)
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
