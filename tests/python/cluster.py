"""A cluster on this host for multi-node tests: scripts/cluster.sh's nodes (network namespaces on
a bridge, each with its own address, cache directory and /dev/shm) and its S3 server, brought up
for one test and always removed after it.

    def test_x(make_cluster):                 # conftest.py lends the fixture to every test
        c = make_cluster(3)                   # 3 nodes and S3 on the bridge
        c.run(0, ["python", "-c", "..."])     # on node 0, bounded in time
        p = c.popen(1, [...], stdout=f)       # a long-running command on node 1
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any, Dict, List

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cluster.sh"


class Cluster:
    """Nodes 0..nodes-1 of one scripts/cluster.sh cluster; `dir` holds its state, each node's
    cache (`node_cache(i)`) and the S3 server's files."""

    def __init__(self, name: str, directory: Path, nodes: int) -> None:
        self.name, self.dir, self.nodes = name, directory, nodes
        self.env = dict(os.environ, ZW_CLUSTER_NAME=name, ZW_CLUSTER_DIR=str(directory))
        self.s3: Dict[str, str] = {}

    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), *args], env=self.env, timeout=timeout,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True)

    def command(self, node: int, args: List[Any]) -> List[str]:
        """The command line that runs `args` on `node`."""
        return ["bash", str(SCRIPT), "exec", str(node), *map(str, args)]

    def run(self, node: int, args: List[Any], timeout: float = 120) -> subprocess.CompletedProcess:
        """Runs `args` on `node` to the end (at most `timeout` seconds); fails the test, with
        its output, if it exits non-zero."""
        done = subprocess.run(self.command(node, args), env=self.env, timeout=timeout,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True)
        assert done.returncode == 0, (f"{args} on node {node} exited {done.returncode}:\n"
                                      f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def popen(self, node: int, args: List[Any], **kwargs: Any) -> subprocess.Popen:
        """Starts `args` on `node` (stdin from /dev/null unless given); the cluster's removal
        stops it if the test does not."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(self.command(node, args), env=self.env, **kwargs)

    def node_cache(self, node: int) -> Path:
        """The node's cache directory (its ZEROWAIT_CACHE_DIR)."""
        return self.dir / f"node-{node}" / "cache"

    def address(self, node: int) -> str:
        state = dict(line.split("=", 1) for line in (self.dir / "cluster.env").read_text()
                     .splitlines() if "=" in line and not line.startswith("#"))
        return f"{state['SUBNET']}.{11 + node}"


def _skip_reason() -> str:
    if os.geteuid() != 0:
        return "scripts/cluster.sh needs root: it creates network namespaces, a bridge and mounts"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2): scripts/cluster.sh makes its nodes with `ip netns`"
    if shutil.which("radosgw") is None:
        return "no radosgw: scripts/setup.sh installs Ceph's RADOS Gateway, the cluster's S3"
    return ""


@pytest.fixture()
def make_cluster(tmp_path_factory):
    """make_cluster(nodes, s3=True) -> Cluster: brings a cluster up for this test (skipped,
    saying why, where it cannot be) and removes it afterwards — namespaces, bridge, mounts,
    every process left in the nodes and the S3 server — whether the test passed or not."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    made: List[Cluster] = []

    def make(nodes: int, s3: bool = True) -> Cluster:
        # A name of its own (8 characters at most: interface names are short), so that clusters
        # of tests running at the same time never meet.
        name = "zwt" + uuid.uuid4().hex[:5]
        cluster = Cluster(name, tmp_path_factory.mktemp("cluster") / name, nodes)
        made.append(cluster)
        up = cluster.script("up", str(nodes), *(["--s3"] if s3 else []))
        if up.returncode != 0:
            if "Operation not permitted" in up.stderr or "Permission denied" in up.stderr:
                pytest.skip(f"network namespaces are not allowed here: {up.stderr.strip()}")
            pytest.fail(f"scripts/cluster.sh up {nodes} failed:\n{up.stderr}")
        if s3:
            cluster.s3 = dict(line.split("=", 1) for line in
                              (cluster.dir / "s3" / "env").read_text().splitlines() if "=" in line)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            down = cluster.script("down")
            assert down.returncode == 0, f"scripts/cluster.sh down failed:\n{down.stderr}"
