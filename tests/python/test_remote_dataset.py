"""A packed dataset served over HTTP by a real server in this process (the standard library's
HTTP server, taught Range requests): zerowait.Dataset and zerowait.Loader read it by URL and see
exactly the local copy; WebDataset tars named by a brace list of URLs read like the local tars; a
server that ignores Range is refused with a clear error."""

from __future__ import annotations

import http.server
import io
import pickle
import random
import re
import tarfile
import threading
from pathlib import Path

import pytest
import zerowait


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files from the server's directory, honouring "Range: bytes=A-B" with a 206 (the
    standard handler always answers with the whole file); HTTP/1.1 keep-alive."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate sends: no 40 ms ACK waits
    ignore_range = False

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if match is not None:
            self.ranged_gets.append(self.path)
        if match is None or self.ignore_range or not path.is_file():
            super().do_GET()
            return
        data = path.read_bytes()
        first = int(match[1])
        last = min(int(match[2]) if match[2] else len(data) - 1, len(data) - 1)
        if first >= len(data):
            self.send_error(416)
            return
        self.send_response(206)
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.end_headers()
        self.wfile.write(data[first:last + 1])


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hangs up mid-answer (as a refused read does) is not news here


def serve(directory: Path, ignore_range: bool = False):
    handler = type("Handler", (RangeHandler,), {"ignore_range": ignore_range, "ranged_gets": []})
    server = QuietServer(
        ("127.0.0.1", 0), lambda *a: handler(*a, directory=str(directory)))
    server.ranged_gets = handler.ranged_gets  # the path of every ranged GET answered, in order
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def batches(dataset) -> list:
    # "block": the order a remote dataset gets by default, asked for explicitly so a local copy
    # is read in the same order.
    loader = zerowait.Loader(dataset, batch_size=5, seed=4, fields=["jpg", "cls"],
                             shuffle="block", block_bytes=16 << 10, window_bytes=64 << 10)
    return [(b["__index__"].tolist(), b["cls"].tolist(), bytes(b["jpg"].numpy())) for b in loader]


def test_a_dataset_over_http_reads_like_its_local_copy(image_dataset):
    server, base = serve(image_dataset.parent)
    try:
        url = f"{base}/{image_dataset.name}/"
        remote = zerowait.Dataset(url)
        local = zerowait.Dataset(image_dataset)
        assert len(remote) == len(local) == 48
        assert remote[17]["jpg"] == local[17]["jpg"]
        assert batches(zerowait.Dataset(url + "manifest.json")) == batches(local)
        # Remote data is read in whole blocks unless asked otherwise; local data shuffles fully.
        assert zerowait.Loader(url, batch_size=5).state_dict()["shuffle"] == "block"
        assert zerowait.Loader(image_dataset, batch_size=5).state_dict()["shuffle"] == "random"
    finally:
        server.shutdown()


def write_webdataset_tars(folder: Path, shards: int = 3, per_shard: int = 20) -> None:
    """shard-000.tar ...: sample KEY is KEY.jpg (random bytes) and KEY.cls (a label in decimal),
    written as WebDataset's own writers do, with tarfile."""
    rng = random.Random(5)
    folder.mkdir(parents=True)
    for shard in range(shards):
        with tarfile.open(folder / f"shard-{shard:03d}.tar", "w") as tar:
            for i in range(per_shard):
                key = f"s{shard}_{i:03d}"
                for field, data in (("jpg", rng.randbytes(rng.randint(100, 9000))),
                                    ("cls", str(i % 4).encode())):
                    info = tarfile.TarInfo(f"{key}.{field}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def test_webdataset_tars_at_urls_read_like_the_local_tars(tmp_path):
    write_webdataset_tars(tmp_path / "web")
    server, base = serve(tmp_path)
    try:
        remote = zerowait.Dataset(f"{base}/web/shard-{{000..002}}.tar")
        local = zerowait.Dataset(str(tmp_path / "web" / "shard-{000..002}.tar"))
        assert len(remote) == len(local) == 60
        assert remote[41]["jpg"] == local[41]["jpg"]
        assert batches(remote) == batches(local)
    finally:
        server.shutdown()


def test_a_server_that_ignores_range_is_refused_clearly(image_dataset):
    server, base = serve(image_dataset.parent, ignore_range=True)
    try:
        with pytest.raises(zerowait.UnsupportedError, match="ignores Range"):
            dataset = zerowait.Dataset(f"{base}/{image_dataset.name}")
            dataset[0]
    finally:
        server.shutdown()


def test_a_cache_dir_serves_the_second_loader_from_local_disk(image_dataset, tmp_path):
    server, base = serve(image_dataset.parent)
    try:
        url = f"{base}/{image_dataset.name}/"
        cache_dir = tmp_path / "cache"

        def epoch():
            loader = zerowait.Loader(url, batch_size=5, seed=4, fields=["jpg", "cls"],
                                     cache_dir=cache_dir, cache_bytes=64 << 20,
                                     block_bytes=16 << 10, window_bytes=64 << 10)
            got = [(b["__index__"].tolist(), b["cls"].tolist(), bytes(b["jpg"].numpy()))
                   for b in loader]
            return got, loader.stats()["cache"]

        first, first_cache = epoch()
        assert first == batches(zerowait.Dataset(image_dataset))
        assert first_cache["misses"] > 0
        assert first_cache["bytes_downloaded"] > 0
        assert 0 < first_cache["usage_bytes"] <= 64 << 20
        assert first_cache["capacity_bytes"] == 64 << 20

        # A new loader (as a new process would) finds every block on disk.
        second, second_cache = epoch()
        assert second == first
        assert second_cache["misses"] == 0
        assert second_cache["hits"] > 0
        assert zerowait.Loader(image_dataset, batch_size=5).stats()["cache"] is None
    finally:
        server.shutdown()


def test_a_dataset_with_a_cache_dir_reads_through_the_cache_and_pickles_with_it(image_dataset,
                                                                               tmp_path):
    server, base = serve(image_dataset.parent)
    try:
        url = f"{base}/{image_dataset.name}/"
        cache_dir = tmp_path / "cache"
        local = zerowait.Dataset(image_dataset)
        remote = zerowait.Dataset(url, cache_dir=cache_dir, cache_bytes=64 << 20)
        assert [remote[i] for i in range(len(remote))] == [local[i] for i in range(len(local))]
        assert any(p.is_file() for p in (cache_dir / "blocks").rglob("*"))
        assert server.ranged_gets, "the first reads download"
        # A copy (as a DataLoader worker gets) opens the same cache: it reads every sample
        # again without a single ranged GET.
        downloads = len(server.ranged_gets)
        clone = pickle.loads(pickle.dumps(remote))
        assert [clone[i] for i in range(len(clone))] == [local[i] for i in range(len(local))]
        assert len(server.ranged_gets) == downloads
        # So does a Loader made from the dataset: it reads through the dataset's cache.
        assert (remote.cache_dir, remote.cache_bytes) == (str(cache_dir), 64 << 20)
        loader = zerowait.Loader(remote, batch_size=5, fields=["jpg", "cls"])
        assert loader.stats()["cache"]["capacity_bytes"] == 64 << 20
        assert sum(b["__index__"].numel() for b in loader) == len(local)
        assert len(server.ranged_gets) == downloads
    finally:
        server.shutdown()
