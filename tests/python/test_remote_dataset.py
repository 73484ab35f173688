"""A packed dataset served over HTTP by a real server in this process (the standard library's
HTTP server, taught Range requests): zerowait.Dataset and zerowait.Loader read it by URL and see
exactly the local copy; WebDataset tars named by a brace list of URLs read like the local tars; a
server that ignores Range is refused with a clear error; HTTPS verifies the server against the CA
bundle the user names, or the one the system has wherever its distribution keeps it."""

from __future__ import annotations

import http.server
import io
import pickle
import random
import os
import re
import ssl
import subprocess
import sys
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


def serve(directory: Path, ignore_range: bool = False, tls: ssl.SSLContext | None = None):
    handler = type("Handler", (RangeHandler,), {"ignore_range": ignore_range, "ranged_gets": []})
    server = QuietServer(
        ("127.0.0.1", 0), lambda *a: handler(*a, directory=str(directory)))
    server.ranged_gets = handler.ranged_gets  # the path of every ranged GET answered, in order
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    scheme = "https" if tls is not None else "http"
    return server, f"{scheme}://127.0.0.1:{server.server_address[1]}"


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
            # Without the cache: a cache's block spans these small shards whole, and a whole
            # object is what such a server sends.
            dataset = zerowait.Dataset(f"{base}/{image_dataset.name}", cache_dir=False)
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
        assert first_cache["misses"] + first_cache["prefetched"] > 0  # reads or read-ahead
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


# ---------------------------------------------------------------------------------------------
# HTTPS: which CA bundle the server is verified against. Each read runs in its own process: the
# bundle is chosen once per process.

READ = "import sys, zerowait; d = zerowait.Dataset(sys.argv[1]); print(len(d), len(d[7]['jpg']))"


@pytest.fixture()
def https_dataset(image_dataset, tmp_path):
    """image_dataset served over HTTPS with a self-signed certificate for 127.0.0.1: (URL of the
    dataset, the certificate, which is its own CA, what READ prints for the local copy)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server, base = serve(image_dataset.parent, tls=tls)
    local = zerowait.Dataset(image_dataset)
    yield f"{base}/{image_dataset.name}/", cert, [str(len(local)), str(len(local[7]["jpg"]))]
    server.shutdown()


def read_in_a_process(url: str, prefix: tuple = (), **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "CURL_CA_BUNDLE")}
    return subprocess.run([*prefix, sys.executable, "-c", READ, url],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_https_verifies_the_server_against_the_bundle_ssl_cert_file_names(https_dataset):
    url, cert, expected = https_dataset
    trusted = read_in_a_process(url, SSL_CERT_FILE=str(cert))
    assert trusted.returncode == 0 and trusted.stdout.split() == expected, trusted.stderr
    # The system's bundle does not hold this certificate: refused, saying what to set.
    refused = read_in_a_process(url)
    assert refused.returncode != 0
    assert "CA bundle: " in refused.stderr and "SSL_CERT_FILE=PATH.pem" in refused.stderr


def test_without_the_builtin_bundle_the_one_where_another_distribution_keeps_it_is_used(
        https_dataset):
    """libcurl's built-in bundle is Debian's /etc/ssl/certs/ca-certificates.crt; a private mount
    of an empty /etc/ssl holding only /etc/ssl/cert.pem (Alpine's place) is a system without it."""
    if os.geteuid() != 0:
        pytest.skip("a private mount namespace needs root")
    url, cert, expected = https_dataset
    inside = ("unshare", "--mount", "sh", "-c",
              f'mount -t tmpfs tmpfs /etc/ssl && cp "{cert}" /etc/ssl/cert.pem && exec "$@"', "-")
    result = read_in_a_process(url, prefix=inside)
    assert result.returncode == 0 and result.stdout.split() == expected, result.stderr
