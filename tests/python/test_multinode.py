"""A multi-node job end to end on a cluster on this host (scripts/cluster.sh, through the
make_cluster fixture): 3 nodes x 2 ranks under torchrun's c10d rendezvous run
examples/multinode_train.py against the cluster's S3 server, a generated data set packed to
s3:// read through each node's own cache, a checkpoint every epoch mirrored to s3://, then the
same job again for one more epoch, resumed from the newest checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import create_bucket

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "multinode_train.py"
sys.path.insert(0, str(EXAMPLE.parent))
import multinode_train  # noqa: E402  (the example's readers of what the ranks wrote)

NODES, RANKS_PER_NODE, SAMPLES, EPOCHS = 3, 2, 192, 2
JOB_TIMEOUT = 420  # seconds for all three nodes' torchrun together


def start_job(cluster, bucket: str, out: Path, ckpt: Path, epochs: int, logs: Path) -> list:
    """torchrun on every node, the c10d rendezvous on node 0; returns (process, log) pairs."""
    jobs = []
    for node in range(NODES):
        log = open(logs / f"node-{node}-{time.monotonic_ns()}.log", "w")
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", NODES,
                   "--nproc-per-node", RANKS_PER_NODE, "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"{cluster.address(0)}:29400", "--rdzv-id", out.name,
                   # Node 0 hosts the rendezvous store: said outright, since torchrun's
                   # guess compares the endpoint with the addresses of the hostname, which
                   # every namespace shares with the host.
                   "--rdzv-conf", f"join_timeout=120,is_host={int(node == 0)}",
                   "--max-restarts", 1,
                   "--local-addr", cluster.address(node),
                   EXAMPLE, "train", "--data", f"s3://{bucket}/ds", "--ckpt", ckpt,
                   "--mirror", f"s3://{bucket}/ckpt", "--out", out, "--epochs", epochs]
        jobs.append((cluster.popen(node, command, stdout=log, stderr=subprocess.STDOUT), log))
    return jobs


def wait_job(jobs: list) -> str:
    """Waits for every node's torchrun (JOB_TIMEOUT in all); returns node 0's output. Fails the
    test with every node's output if one fails or time runs out (the fixture then stops them)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    codes = []
    for process, log in jobs:
        try:
            codes.append(process.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(f"still running after {JOB_TIMEOUT} s")
        log.close()
    outputs = [Path(log.name).read_text() for _, log in jobs]
    if codes != [0] * NODES:
        pytest.fail("the job failed: " + "; ".join(
            f"node {i}: {code}\n{out[-4000:]}"
            for i, (code, out) in enumerate(zip(codes, outputs))))
    return outputs[0]


def per_node(records: list, epoch: int, field: str, node: str = "cluster_node") -> dict:
    """node -> the sum of `field` over that node's ranks in `epoch`; nodes numbered as the
    cluster does (`cluster_node`) or as the rendezvous did (`node`)."""
    totals: dict = {}
    for r in records:
        if r["epoch"] == epoch:
            totals[int(r[node])] = totals.get(int(r[node]), 0) + r[field]
    return totals


@pytest.mark.slow
def test_three_nodes_train_every_sample_once_an_epoch_reading_their_share_from_their_own_cache(
        make_cluster, tmp_path, cli):
    cluster = make_cluster(NODES)
    bucket = "zw-" + uuid.uuid4().hex[:16]
    create_bucket(cluster.s3, bucket)
    cluster.run(0, [sys.executable, EXAMPLE, "generate", "--out", f"s3://{bucket}/ds",
                    "--samples", SAMPLES], timeout=180)
    out, ckpt, logs = tmp_path / "run", tmp_path / "ckpt", tmp_path / "logs"
    logs.mkdir()
    node0 = wait_job(start_job(cluster, bucket, out, ckpt, EPOCHS, logs))

    # Every sample trained exactly once an epoch, over the six ranks.
    everything = sorted(f"sample-{i:06d}" for i in range(SAMPLES))
    trained = multinode_train.trained_keys(out)
    assert sorted(trained) == list(range(EPOCHS))
    for epoch in range(EPOCHS):
        assert sorted(trained[epoch]) == everything, f"epoch {epoch}"

    records = multinode_train.read_jsonl(out, "epochs")
    assert len(records) == NODES * RANKS_PER_NODE * EPOCHS
    # Node-stable shares: each node trained the same samples in both epochs, and its ranks read
    # through that node's own cache directory.
    keys = multinode_train.read_jsonl(out, "keys")
    node_of_rank = {r["rank"]: int(r["cluster_node"]) for r in records}
    for node in range(NODES):
        shares = [sorted(k for line in keys if line["epoch"] == epoch
                         and node_of_rank[line["rank"]] == node for k in line["keys"])
                  for epoch in range(EPOCHS)]
        assert shares[0] == shares[1] and 0 < len(shares[0]) < SAMPLES, f"node {node}"
    for r in records:
        assert Path(r["cache_dir"]).parent == cluster.node_cache(int(r["cluster_node"]))

    # Epoch 0 downloaded each block of a node's share once for the node (its two ranks share the
    # cache: the blocks they downloaded are the block files there); epoch 1 downloaded nothing.
    cold, warm = per_node(records, 0, "data_gets"), per_node(records, 1, "data_gets")
    for node in range(NODES):
        blocks = list((cluster.node_cache(node) / "blocks").rglob("*.blk"))
        assert cold[node] == len(blocks) > 0, f"node {node}"
        assert warm[node] == 0, f"node {node} fetched {warm[node]} blocks in the warm epoch"
        assert per_node(records, 1, "bytes_downloaded")[node] == 0
        assert per_node(records, 1, "hits")[node] > 0
    for epoch in range(EPOCHS):  # rank 0's table shows the same numbers
        for node, gets in per_node(records, epoch, "data_gets", node="node").items():
            assert f"epoch {epoch} node {node}: {SAMPLES // NODES} samples, {gets} GETs" in node0

    # A checkpoint at the end of each epoch, committed in the shared directory and mirrored.
    epoch_ends = sorted({max(line["step"] for line in keys if line["epoch"] == epoch)
                         for epoch in range(EPOCHS)})
    for where in (ckpt, f"s3://{bucket}/ckpt"):
        listed = json.loads(cluster.run(0, [cli, "ckpt", "ls", where, "--json"]).stdout)
        assert [s["step"] for s in listed["steps"]] == epoch_ends, where
        assert {s["world_size"] for s in listed["steps"]} == {NODES * RANKS_PER_NODE}
    cluster.run(0, [cli, "ckpt", "verify", f"s3://{bucket}/ckpt"])

    # The same command for one more epoch: a new job resumes from the newest checkpoint (loader
    # state included) and trains the third epoch, each node from its warm cache.
    node0 = wait_job(start_job(cluster, bucket, out, ckpt, EPOCHS + 1, logs))
    assert f"resumed from step {epoch_ends[-1]} (epoch {EPOCHS})" in node0
    trained = multinode_train.trained_keys(out)
    assert sorted(trained[EPOCHS]) == everything
    records = multinode_train.read_jsonl(out, "epochs")
    assert per_node(records, EPOCHS, "data_gets") == dict.fromkeys(range(NODES), 0)
    keys = multinode_train.read_jsonl(out, "keys")

    # The StepProfiler's run directory from every rank, one row per step it trained (in the
    # last job, which wrote it last).
    for rank in range(NODES * RANKS_PER_NODE):
        run = out / "profile" / f"rank-{rank:03d}"
        summary = json.loads((run / "run.json").read_text())
        assert summary["kind"] == "profile"
        rows = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
        assert sum(row.get("steps", 1) for row in rows) == sum(
            1 for line in keys if line["rank"] == rank and line["epoch"] == EPOCHS)
        assert summary["seconds"]["communication"] > 0
