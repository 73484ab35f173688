"""zerowait.ray.write_dataset: a Ray Data dataset packed by the tasks of a local Ray cluster (a
head and two worker nodes, separate processes) into one dataset in a bucket of the real S3
server, compared with a single-process write of the same samples."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import zerowait

ray = pytest.importorskip(
    "ray.data", reason="Ray is not installed: scripts/setup.sh --tests installs ray[data]")
import ray  # noqa: E402  (ray.data above imported it)
from ray.cluster_utils import Cluster  # noqa: E402

import zerowait.ray as zray  # noqa: E402

from helpers import create_bucket  # noqa: E402

pytestmark = pytest.mark.slow

NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}


@pytest.fixture(scope="module")
def ray_cluster(s3_server):
    """A head (no CPU: it schedules no task) and two one-CPU worker nodes, each node its own
    raylet and worker processes, which inherit the S3 server's settings from this process."""
    saved = dict(os.environ)
    os.environ.update(s3_server)
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent/credentials"
    os.environ["AWS_CONFIG_FILE"] = "/nonexistent/config"
    os.environ["RAY_DATA_DISABLE_PROGRESS_BARS"] = "1"
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "object_store_memory": 80 << 20, "include_dashboard": False})
        workers = [cluster.add_node(**NODE) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        yield [w.node_id for w in workers]
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        os.environ.clear()
        os.environ.update(saved)


def make_rows(count: int) -> list[dict]:
    rng = np.random.default_rng(7)
    return [{"__key__": f"sample-{i:05d}",
             "bin": rng.bytes(int(rng.integers(100, 4000))),
             "txt": f"caption {i} é",
             "cls": i % 10,
             "npy": rng.standard_normal(6).astype(np.float32),
             "flag": bool(i % 3)} for i in range(count)]


def by_key(ds: zerowait.Dataset) -> dict[str, dict[str, bytes]]:
    return {ds.key(i): ds[i] for i in range(len(ds))}


def test_a_ray_dataset_packed_on_two_nodes_equals_a_single_process_pack(
        ray_cluster, s3_server, cli, tmp_path):
    bucket = "zw-ray-" + os.urandom(6).hex()
    create_bucket(s3_server, bucket)
    rows = make_rows(300)
    local = zerowait.write_dataset(rows, tmp_path / "local", shard_size=64 << 10)
    url = f"s3://{bucket}/ray-ds"

    report = zray.write_dataset(ray.data.from_items(rows, override_num_blocks=6), url,
                                shard_size=64 << 10)

    assert report["manifest_path"] == f"{url}/manifest.json"
    assert report["samples"] == 300 and report["quarantined"] == []
    assert sum(t["samples"] for t in report["tasks"]) == 300
    # The parts were written by different worker processes on both worker nodes.
    assert len({t["pid"] for t in report["tasks"]}) > 1
    assert {t["node"] for t in report["tasks"]} == set(ray_cluster)
    assert all(t["dir"].startswith(report["run_dir"] + "/task-") for t in report["tasks"])

    # verify=True: every read checks the sample's stored xxHash3 against its bytes.
    remote = zerowait.Dataset(url, cache_dir=False, verify=True)
    here = zerowait.Dataset(tmp_path / "local", verify=True)
    assert local["samples"] == len(remote) == 300
    assert by_key(remote) == by_key(here)
    assert remote.fields == here.fields == ["bin", "cls", "flag", "npy", "txt"]
    assert remote.verify() == []
    assert len(remote.shards) == report["shards"] > len(report["tasks"])

    env = {**os.environ, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
           "AWS_CONFIG_FILE": "/nonexistent/config"}
    verify = subprocess.run([str(cli), "verify", url,
                             "--no-cache"], env=env, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    with pytest.raises(zerowait.AlreadyExistsError, match="manifest.json already exists"):
        zray.write_dataset(ray.data.from_items(rows[:10]), url)


def test_a_failed_task_or_merge_publishes_no_dataset(ray_cluster, s3_server):
    bucket = "zw-ray-" + os.urandom(6).hex()
    create_bucket(s3_server, bucket)
    rows = make_rows(200)

    def fail_on_one_block(batch: dict) -> dict:  # local: Ray ships it by value to the workers
        if "sample-00150" in list(batch["__key__"]):
            raise RuntimeError("this block cannot be made")
        return batch

    failing = ray.data.from_items(rows, override_num_blocks=4).map_batches(fail_on_one_block)
    with pytest.raises(Exception, match="this block cannot be made"):
        zray.write_dataset(failing, f"s3://{bucket}/failed")
    with pytest.raises(zerowait.ZerowaitNotFoundError):
        zerowait.Dataset(f"s3://{bucket}/failed/manifest.json", cache_dir=False)

    # The same key in two tasks' rows: the merge refuses it, naming the key.
    twice = rows[:100] + [{**rows[0], "bin": b"other"}]
    with pytest.raises(zerowait.InvalidArgumentError, match="sample key 'sample-00000' is in"):
        zray.write_dataset(ray.data.from_items(twice, override_num_blocks=2),
                           f"s3://{bucket}/twice")
    with pytest.raises(zerowait.ZerowaitNotFoundError):
        zerowait.Dataset(f"s3://{bucket}/twice/manifest.json", cache_dir=False)

    with pytest.raises(Exception, match="has no '__key__' column"):
        zray.write_dataset(ray.data.from_items([{"txt": "no key"}]), f"s3://{bucket}/keyless")
