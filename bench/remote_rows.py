"""The tasks of the remote-data benchmark (bench/remote.py, whose docstring says what each row
measures and why the comparison is fair), each run in a process of its own:

    python remote_rows.py TASK SPEC_JSON

prints the task's result as one JSON line on stdout (progress goes to stderr). A task runs in
the interpreter that has its library: the zerowait rows in the project's .venv, LitData,
WebDataset and s3torchconnector in the peers' venv, MosaicML Streaming in a venv of its own
(it pins numpy < 2.2). So this module imports the standard library alone at the top, and each
task imports its library inside.

TASKS maps the names to the functions: the writers (`write_litdata`, `write_mds`), `upload`
(boto3, straight to the S3 server), and one function per reader row. Every reader row returns
{"epochs": [cold, warm, warm, ...]}: the first epoch timed from before the dataset object is
made (opening a remote dataset is part of a cold epoch), the others from iter() to the last
batch; each {"seconds", "samples", "bytes", "batches", "first_batch_s"}.
"""

import functools
import json
import os
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (standard library only)

log = functools.partial(common.log, tag="remote-bench")

FIELDS = ("bin", "cls")  # the data set's two fields: random bytes, and an integer label
MAX_WARM_EPOCHS = 50


def tar_samples(tars):
    """(key, payload bytes, label int) of every sample of the WebDataset tars, in order: the one
    source every format is written from, so all hold the same bytes."""
    for path in tars:
        with tarfile.open(path) as tar:
            pending = {}
            for member in tar:
                key, _, field = member.name.rpartition(".")
                pending.setdefault(key, {})[field] = tar.extractfile(member).read()
                if len(pending[key]) == len(FIELDS):
                    sample = pending.pop(key)
                    yield key, sample["bin"], int(sample["cls"])


# ---- writing the formats (each in its library's interpreter) -------------------------------------

def _litdata_items(tar_path):
    for _, payload, label in tar_samples([tar_path]):
        yield {"bin": payload, "cls": label}


def write_litdata(spec):
    """LitData's optimized format: litdata.optimize over the tars, one worker (keeps the order),
    chunks of spec["shard_bytes"]."""
    import litdata
    litdata.optimize(fn=_litdata_items, inputs=spec["tars"], output_dir=spec["out"],
                     chunk_bytes=spec["shard_bytes"], num_workers=1, reorder_files=False,
                     mode="overwrite", verbose=False, start_method="fork")
    return {"version": litdata.__version__}


def write_mds(spec):
    """MosaicML Streaming's MDS: MDSWriter, columns bin (bytes) and cls (int), shards of
    spec["shard_bytes"], no compression (the payload is random)."""
    import streaming
    from streaming import MDSWriter
    with MDSWriter(out=spec["out"], columns={"bin": "bytes", "cls": "int"},
                   size_limit=spec["shard_bytes"]) as writer:
        for _, payload, label in tar_samples(spec["tars"]):
            writer.write({"bin": payload, "cls": label})
    return {"version": streaming.__version__}


def upload(spec):
    """Uploads every file under each local folder to its prefix in the bucket (which remote.py
    made), straight to the S3 server (not through the proxy), 8 at a time."""
    import boto3
    from concurrent.futures import ThreadPoolExecutor
    from boto3.s3.transfer import TransferConfig
    s3 = boto3.client("s3", endpoint_url=spec["endpoint"])
    bucket = spec["bucket"]
    jobs = []
    for folder, prefix in spec["folders"].items():
        for path in common.regular_files(folder):
            jobs.append((path, f"{prefix}/{os.path.relpath(path, folder)}"))
    config = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=16 << 20)
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda job: s3.upload_file(job[0], bucket, job[1], Config=config), jobs))
    return {"objects": len(jobs), "bytes": common.total_bytes(path for path, _ in jobs),
            "seconds": time.perf_counter() - start}


# ---- timing --------------------------------------------------------------------------------------

def count_batch(payloads, labels):
    """(samples, payload bytes) of a batch given as a list of bytes and its labels."""
    return len(labels), sum(len(p) for p in payloads)


def timed_epochs(start, loader, count, spec):
    """Iterates `loader` for one epoch, then warm epochs: at least spec["warm_epochs"], and more
    until spec["warm_seconds"] of them are timed (at most MAX_WARM_EPOCHS), so that epochs of a
    tenth of a second are measured over a second or more. The first epoch is timed from `start`
    (before the dataset object was made), the others from iter(). count(batch) gives (samples,
    bytes). remote.py judges the warm epochs by their total samples over their total seconds,
    so running more of them favours no row."""
    results = []
    warm_seconds = 0.0
    while (len(results) < 1 + spec["warm_epochs"] or warm_seconds < spec["warm_seconds"]) \
            and len(results) < 1 + MAX_WARM_EPOCHS:
        epoch = len(results)
        t0 = start if epoch == 0 else time.perf_counter()
        samples = nbytes = batches = 0
        first = None
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
            s, b = count(batch)
            samples += s
            nbytes += b
            batches += 1
        seconds = time.perf_counter() - t0
        if epoch > 0:
            warm_seconds += seconds
        results.append({"seconds": seconds, "samples": samples, "bytes": nbytes,
                        "batches": batches, "first_batch_s": first})
        if epoch < 1 + spec["warm_epochs"]:
            log(f"  epoch {epoch} ({'cold' if epoch == 0 else 'warm'}): {seconds:.2f} s, "
                f"{samples} samples, {samples / seconds:,.0f} samples/s")
    if len(results) > 1 + spec["warm_epochs"]:
        log(f"  ... {len(results) - 1} warm epochs in {warm_seconds:.2f} s")
    return results


def versions(*modules):
    out = {}
    for name in modules:
        try:
            from importlib.metadata import version
            out[name] = version(name)
        except Exception:  # noqa: BLE001 - a version is information only
            out[name] = "?"
    return out


def fresh_dir(path):
    """An empty folder at `path` (a cold cache)."""
    import shutil
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


# ---- zerowait ------------------------------------------------------------------------------------

def _zerowait_counts(batch):
    return batch["__index__"].numel(), batch["bin"].numel()


def _zerowait_loader(spec, data, **extra):
    import zerowait
    if spec.get("window_bytes"):
        extra["window_bytes"] = spec["window_bytes"]
    return zerowait.Loader(data, batch_size=spec["batch_size"], threads=spec["workers"],
                           shuffle=spec["shuffle"], seed=0, **extra)


def row_zerowait_remote(spec, url=None):
    """zerowait.Loader over s3:// through the proxy with a node-local cache: the first epoch
    with the cache empty (cold), then warm epochs served from it."""
    import torch  # noqa: F401  (as in a training script; not timed)
    import zerowait  # noqa: F401
    cache = fresh_dir(spec["cache_dir"])
    start = time.perf_counter()
    loader = _zerowait_loader(spec, url or spec["url"], cache_dir=cache)
    open_s = time.perf_counter() - start
    try:
        before = loader.stats()
        epochs = timed_epochs(start, loader, _zerowait_counts, spec)
        stats = loader.stats()
    finally:
        loader.close()
    return {"epochs": epochs, "open_s": open_s, "wait_s": stats["wait_s"] - before["wait_s"],
            "cache": stats.get("cache"), "versions": versions("zerowait")}


def row_zerowait_local(spec):
    """The reference: zerowait.Loader over the same shards on local disk (in the page cache),
    same options. Its first epoch is a warm-up (arenas faulted in); remote.py judges the
    others, as it judges every row's warm epochs."""
    import torch  # noqa: F401
    import zerowait  # noqa: F401
    start = time.perf_counter()
    loader = _zerowait_loader(spec, spec["local"])
    try:
        epochs = timed_epochs(start, loader, _zerowait_counts, spec)
    finally:
        loader.close()
    return {"epochs": epochs, "versions": versions("zerowait")}


def row_zerowait_tars(spec):
    """The same over the WebDataset tars the WebDataset and s3torchconnector rows read, named by
    a brace list of s3:// URLs ({shard-000000,shard-000001,...}.tar): Loader() scans every tar
    for its index, which through the cache is the tar's download."""
    names = ",".join(Path(key).stem for key in spec["keys"])
    folder = Path(spec["keys"][0]).parent
    return row_zerowait_remote(spec, f"s3://{spec['bucket']}/{folder}/{{{names}}}.tar")


# ---- peers ---------------------------------------------------------------------------------------

def _dict_counts(batch):
    return count_batch(batch["bin"], batch["cls"])


def collate_bytes(items):
    """The batch as WebDataset's batched() makes it: the payloads as a list of bytes, the labels
    as a tensor. default_collate cannot batch payloads of different sizes, and LitData hands
    out memoryviews, which cannot cross from a worker: bytes() copies those (MDS's are bytes
    already, and bytes() of bytes is the same object)."""
    import torch
    return {"bin": [bytes(item["bin"]) for item in items],
            "cls": torch.tensor([item["cls"] for item in items], dtype=torch.int64)}


def _tuple_counts(batch):
    return count_batch(batch[0], batch[1])


def row_litdata(spec):
    """LitData StreamingDataset + StreamingDataLoader from s3:// (its obstore downloader, and
    boto3 for the index, through the proxy), shuffle=True, batch_decode="all", cache_dir empty
    at the start: epoch 0 downloads the chunks, later epochs read them from the cache."""
    import torch  # noqa: F401
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader
    # LitData's chunk downloads go through obstore, whose client refuses plain http unless
    # told (the test server has no TLS; an https endpoint needs nothing). Its client options
    # are a module-level dict, read when a worker builds its store.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    cache = fresh_dir(spec["cache_dir"])
    start = time.perf_counter()
    # batch_decode="all": a chunk that two workers share is not memory-mapped, and its default
    # decode window here (a few rows) reads the whole 64 MB chunk file again for each window
    # it misses: the cold epoch took 45 s instead of 4 s, 0 (per item) 136 s. "all" decodes a
    # chunk once per visit: LitData's fastest setting on this data.
    dataset = StreamingDataset(spec["url"], cache_dir=cache, shuffle=True, seed=0,
                               batch_decode="all",
                               storage_options={"endpoint_url": spec["endpoint"]})
    loader = StreamingDataLoader(dataset, batch_size=spec["batch_size"],
                                 num_workers=spec["workers"], persistent_workers=True,
                                 collate_fn=collate_bytes)
    epochs = timed_epochs(start, loader, _dict_counts, spec)
    return {"epochs": epochs, "versions": versions("litdata", "torch", "boto3", "obstore")}


def row_mds(spec):
    """MosaicML Streaming StreamingDataset from s3:// (boto3 through the proxy, found from
    $S3_ENDPOINT_URL), shuffle=True, local cache empty at the start, in a DataLoader."""
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    clean_stale_shared_memory()
    cache = fresh_dir(spec["cache_dir"])
    start = time.perf_counter()
    dataset = StreamingDataset(remote=spec["url"], local=cache, shuffle=True, shuffle_seed=0,
                               batch_size=spec["batch_size"])
    # The dataset fetched index.json with a boto3 client whose kept-alive connection the forked
    # workers would inherit and share: half the cold epochs then stalled for download_timeout
    # (60 s), and one run crashed on a garbled shard. Dropping the client here (what Streaming
    # does itself before a retry) gives each worker its own.
    for stream in dataset.streams:
        stream._downloader.clean_up()
    loader = torch.utils.data.DataLoader(dataset, batch_size=spec["batch_size"],
                                         num_workers=spec["workers"], persistent_workers=True,
                                         collate_fn=collate_bytes)
    epochs = timed_epochs(start, loader, _dict_counts, spec)
    return {"epochs": epochs, "versions": versions("mosaicml-streaming", "torch", "boto3",
                                                   "numpy")}


def row_webdataset(spec):
    """WebDataset over HTTP: the tar shards by presigned URLs through the proxy, read with
    webdataset's own http handler (curl), shards shuffled and split across the DataLoader
    workers, cached in cache_dir (empty at the start) so later epochs read local files."""
    import boto3
    import torch
    import webdataset as wds
    s3 = boto3.client("s3", endpoint_url=spec["endpoint"])
    urls = [s3.generate_presigned_url("get_object", Params={"Bucket": spec["bucket"],
                                                            "Key": key}, ExpiresIn=3600)
            for key in spec["keys"]]
    cache = fresh_dir(spec["cache_dir"])
    start = time.perf_counter()
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=0, cache_dir=cache,
                             nodesplitter=wds.single_node_only,
                             workersplitter=wds.split_by_worker)
    dataset = dataset.shuffle(spec["shuffle_buffer"]).to_tuple("bin", "cls") \
        .map_tuple(None, int).batched(spec["batch_size"], partial=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=spec["workers"],
                                         persistent_workers=True)
    epochs = timed_epochs(start, loader, _tuple_counts, spec)
    return {"epochs": epochs, "versions": versions("webdataset", "torch")}


def row_s3torchconnector(spec):
    """s3torchconnector S3IterableDataset over the tar shards (endpoint = the proxy, path style),
    in listing order, sharded across the DataLoader workers, each object streamed into
    WebDataset's tar reader (AWS's documented pairing), samples through a shuffle buffer. It
    has no cache: every epoch reads S3."""
    import torch
    import webdataset as wds
    from s3torchconnector import S3ClientConfig, S3IterableDataset
    from webdataset.tariterators import group_by_keys, tar_file_expander

    def as_stream(reader):
        return {"url": reader.key, "stream": reader}

    def samples(streams):  # wds.tarfile_to_samples without its url opener: S3 opened them
        return group_by_keys(tar_file_expander(streams))

    start = time.perf_counter()
    source = S3IterableDataset.from_prefix(
        spec["url"], region=spec["region"], endpoint=spec["endpoint"], transform=as_stream,
        s3client_config=S3ClientConfig(force_path_style=True), enable_sharding=True)
    dataset = wds.DataPipeline(source, samples, wds.shuffle(spec["shuffle_buffer"]),
                               wds.to_tuple("bin", "cls"), wds.map_tuple(None, int),
                               wds.batched(spec["batch_size"], partial=True))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=spec["workers"],
                                         persistent_workers=True)
    epochs = timed_epochs(start, loader, _tuple_counts, spec)
    return {"epochs": epochs, "versions": versions("s3torchconnector", "webdataset", "torch")}


TASKS = {
    "write_litdata": write_litdata,
    "write_mds": write_mds,
    "upload": upload,
    "zerowait": row_zerowait_remote,
    "zerowait_tars": row_zerowait_tars,
    "local": row_zerowait_local,
    "litdata": row_litdata,
    "mds": row_mds,
    "webdataset": row_webdataset,
    "s3torchconnector": row_s3torchconnector,
}


def main(argv):
    if len(argv) != 3 or argv[1] not in TASKS:
        sys.exit(f"usage: {argv[0]} TASK SPEC_JSON, TASK one of {','.join(TASKS)} "
                 "(bench/remote.py runs it)")
    result = TASKS[argv[1]](json.loads(argv[2]))
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
