"""Remote data is cached by default: a Loader or Dataset opened on an s3:// dataset (the real
Ceph RGW the suite starts) with default options reads through the node-local cache in the
default directory, so the second epoch makes no GET for data; cache_dir=False reads without one,
and local data is never cached."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import zerowait


class CountingProxy:
    """A TCP relay in front of the S3 server that counts the GET requests passing through it
    (SigV4 signs the Host the client used, which the server checks as received)."""

    def __init__(self, endpoint: str) -> None:
        host, port = endpoint.removeprefix("http://").rstrip("/").split(":")
        self.target = (host, int(port))
        self.gets = 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self.relay, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self.relay, args=(server, client, False), daemon=True).start()

    def relay(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if requests:  # no request bodies while reading: request lines start chunks
                    with self.lock:
                        self.gets += data.count(b"GET /")
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()
            source.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture()
def s3_dataset(image_tree, bucket) -> str:
    """image_tree packed into the bucket, as image_dataset is packed locally."""
    url = f"s3://{bucket}/ds"
    zerowait.pack(image_tree, url, imagefolder=True, shard_size=64 * 1024, sync=False)
    return url


def read_epoch(loader) -> list:
    return [(b["__index__"].tolist(), bytes(b["jpg"].numpy())) for b in loader]


def loader_of(data, **options) -> zerowait.Loader:
    return zerowait.Loader(data, batch_size=5, seed=4, fields=["jpg", "cls"], shuffle="block",
                           block_bytes=16 << 10, window_bytes=64 << 10, **options)


# Two epochs of Loader(url) with default options in a fresh process (the S3 endpoint is read once
# per process), which waits for a line on stdin between them and prints each epoch's cache stats.
TWO_EPOCHS = """
import json, sys, zerowait
loader = zerowait.Loader(sys.argv[1], batch_size=5, seed=4, fields=["jpg", "cls"])
for epoch in range(2):
    samples = sum(b["__index__"].numel() for b in loader)
    print(json.dumps({"samples": samples, "cache": loader.stats()["cache"]}), flush=True)
    sys.stdin.readline()
"""


def test_the_second_epoch_of_a_remote_loader_with_default_options_makes_no_get(s3_dataset):
    proxy = CountingProxy(os.environ["AWS_ENDPOINT_URL"])
    env = dict(os.environ, AWS_ENDPOINT_URL=proxy.url)
    child = subprocess.Popen([sys.executable, "-c", TWO_EPOCHS, s3_dataset], env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        first = json.loads(child.stdout.readline())
        gets_after_first = proxy.gets
        child.stdin.write("\n")
        child.stdin.flush()
        second = json.loads(child.stdout.readline())
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
        proxy.close()
    assert first["samples"] == second["samples"] == 48
    assert first["cache"] is not None, "a remote dataset reads through a cache by default"
    # Downloaded by the reads or, ahead of them, by the cache's background downloads.
    assert first["cache"]["misses"] + first["cache"]["prefetched"] > 0 and gets_after_first > 0
    # The default cap: a tenth of the file system, at most 64 GiB.
    assert 0 < first["cache"]["capacity_bytes"] <= 64 << 30
    assert any(Path(zerowait.default_cache_dir()).rglob("*.blk")), "blocks in the default place"
    # Every read of the second epoch was served from local disk: not one GET reached the server.
    assert proxy.gets == gets_after_first
    assert second["cache"]["bytes_downloaded"] == first["cache"]["bytes_downloaded"]


def test_another_loader_on_the_node_shares_the_default_cache(s3_dataset, image_dataset):
    loader = loader_of(s3_dataset)
    first = read_epoch(loader)
    assert first == read_epoch(loader_of(image_dataset))
    # As another rank would: every block is on disk already.
    other = loader_of(s3_dataset)
    assert read_epoch(other) == first
    assert other.stats()["cache"]["misses"] == 0


def test_a_remote_dataset_lends_the_default_cache_and_false_turns_it_off(s3_dataset,
                                                                       image_dataset):
    ds = zerowait.Dataset(s3_dataset)
    assert ds.cache_dir == zerowait.default_cache_dir()
    assert 0 < ds.cache_bytes <= 64 << 30
    assert loader_of(ds).stats()["cache"] is not None

    off = zerowait.Dataset(s3_dataset, cache_dir=False)
    assert off.cache_dir is None
    assert off[3] == zerowait.Dataset(image_dataset)[3]
    # The dataset's choice travels to the loader made from it.
    assert loader_of(off).stats()["cache"] is None
    assert loader_of(s3_dataset, cache_dir=False).stats()["cache"] is None
    with pytest.raises(ValueError, match="cache_dir=True"):
        zerowait.Dataset(s3_dataset, cache_dir=True)


def test_local_data_is_never_cached(image_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROWAIT_CACHE_DIR", str(tmp_path / "cache"))
    assert zerowait.default_cache_dir() == str(tmp_path / "cache" / "blocks")
    assert loader_of(image_dataset).stats()["cache"] is None
    assert zerowait.Dataset(image_dataset).cache_dir is None
    assert not (tmp_path / "cache").exists(), "nothing is created for local data"


def test_the_commands_read_a_remote_dataset_through_the_default_cache(s3_dataset, cli, tmp_path):
    env = dict(os.environ, ZEROWAIT_CACHE_DIR=str(tmp_path / "cache"))

    def verify(*flags: str) -> list:
        result = subprocess.run([str(cli), "verify", *flags, s3_dataset], env=env, text=True,
                                capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr
        return list((tmp_path / "cache").rglob("*.blk"))

    assert verify("--no-cache") == [], "--no-cache reads without the cache"
    assert verify() != [], "verify reads a remote dataset through the default cache"
