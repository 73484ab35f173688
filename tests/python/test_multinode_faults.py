"""Faults across nodes, on a cluster on this host (scripts/cluster.sh through the make_cluster
fixture), with examples/multinode_train.py as the job: 3 nodes x 1 rank under torchrun's c10d
rendezvous, data on the cluster's S3 server, checkpoints every 2 steps into a shared directory.
(test_multinode.py runs two ranks a node; one here spares a torch start, about 3 s of CPU, per
node and attempt.)

- every process of one node killed (SIGKILL) mid-epoch, then the node's torchrun started again:
  the group restarts, resumes from the newest committed step with its loader state, and every
  sample of each epoch is trained exactly once over the run;
- one node's link cut: the other nodes fail with an error naming the collective (or the commit)
  that timed out, within the job's timeout, and no step is committed without every rank's part;
- the object store stopped (SIGSTOP) for 30 s mid-epoch: a read past its deadline names the
  object and the range; with a deadline longer than the stall the retries carry the job through.

docs/scale.md ("Faults across nodes") has the figures these runs print.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List

import pytest

from helpers import create_bucket

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "multinode_train.py"
sys.path.insert(0, str(EXAMPLE.parent))
import multinode_train  # noqa: E402  (the example's readers of what the ranks wrote)

NODES, RANKS_PER_NODE, SAMPLES, BATCH = 3, 1, 192, 4
WORLD = NODES * RANKS_PER_NODE
STEPS_PER_EPOCH = SAMPLES // WORLD // BATCH  # 16
CKPT_EVERY = 2
EVERYTHING = sorted(f"sample-{i:06d}" for i in range(SAMPLES))


class Job:
    """examples/multinode_train.py under torchrun on every node of `cluster`; the rendezvous on
    node 0. Each node's output goes to a log of its own under `tmp/logs`."""

    def __init__(self, cluster, tmp: Path, cli: Path, *, max_restarts: int, train_args: List,
                 mirror: bool = False) -> None:
        self.cluster, self.cli = cluster, cli
        self.bucket = "zw-" + uuid.uuid4().hex[:16]
        self.out, self.ckpt, self.logs = tmp / "run", tmp / "ckpt", tmp / "logs"
        self.logs.mkdir()
        self.max_restarts, self.train_args = max_restarts, list(train_args)
        if mirror:
            self.train_args += ["--mirror", f"s3://{self.bucket}/ckpt"]
        self.procs: Dict[int, subprocess.Popen] = {}
        self.log_paths: Dict[int, List[Path]] = {}
        create_bucket(cluster.s3, self.bucket)
        cluster.run(0, [sys.executable, EXAMPLE, "generate", "--out", f"s3://{self.bucket}/ds",
                        "--samples", SAMPLES], timeout=180)

    def start(self, node: int) -> None:
        path = self.logs / f"node-{node}-{len(self.log_paths.get(node, []))}.log"
        self.log_paths.setdefault(node, []).append(path)
        # A node started again joins the survivors' next round only if every round publishes
        # the workers' store address: with the agent's store shared (torch's default) the
        # survivors keep the first round's and never publish it, and the new agent waits for
        # MASTER_ADDR until the rendezvous times out.
        command = ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
                   sys.executable, "-m", "torch.distributed.run", "--nnodes", NODES,
                   "--nproc-per-node", RANKS_PER_NODE, "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"{self.cluster.address(0)}:29400",
                   "--rdzv-id", self.out.name,
                   # Node 0 hosts the rendezvous store (test_multinode.py says why outright).
                   "--rdzv-conf", f"join_timeout=120,is_host={int(node == 0)}",
                   "--max-restarts", self.max_restarts,
                   "--local-addr", self.cluster.address(node),
                   EXAMPLE, "train", "--data", f"s3://{self.bucket}/ds", "--ckpt", self.ckpt,
                   "--out", self.out, "--batch-size", BATCH, "--ckpt-every", CKPT_EVERY,
                   "--keep-last", 100, *self.train_args]
        with open(path, "w") as log:
            self.procs[node] = self.cluster.popen(node, command, stdout=log,
                                                  stderr=subprocess.STDOUT)

    def start_all(self) -> None:
        for node in range(NODES):
            self.start(node)

    def wait(self, timeout: float) -> Dict[int, object]:
        """node -> its torchrun's exit status, or "running" if still running after `timeout`
        seconds in all."""
        deadline = time.monotonic() + timeout
        codes: Dict[int, object] = {}
        for node, process in sorted(self.procs.items()):
            try:
                codes[node] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[node] = "running"
        return codes

    def output(self, node: int) -> str:
        return "\n".join(p.read_text() for p in self.log_paths.get(node, []))

    def outputs(self) -> str:
        return "\n".join(f"--- node {n}:\n{self.output(n)[-4000:]}" for n in range(NODES))

    def keys(self) -> List[Dict]:
        return multinode_train.read_jsonl(self.out, "keys") if self.out.exists() else []

    def _wait_until(self, reached, timeout: float, poll: float, failure: str) -> None:
        """Until `reached()`; fails the test with `failure` and the job's output at `timeout`
        or as soon as a process of the job has ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if reached():
                return
            if any(p.poll() is not None for p in self.procs.values()):
                break
            time.sleep(poll)
        pytest.fail(f"{failure}:\n{self.outputs()}")

    def wait_for_step(self, step: int, timeout: float) -> None:
        """Until every rank has logged `step` (fails the test with the job's output if not)."""
        self._wait_until(
            lambda: len({line["rank"] for line in self.keys() if line["step"] >= step}) == WORLD,
            timeout, 0.2, f"the job did not reach step {step}")

    def wait_for_commit(self, step: int, timeout: float) -> None:
        """Until `step` or a later one is committed (a commit lags the step it saves by the
        time its parts take to reach the shared directory: seconds on busy cores)."""
        self._wait_until(lambda: any(s["step"] >= step for s in self.committed()),
                         timeout, 0.5, f"the job committed no step >= {step}")

    def committed(self) -> List[Dict]:
        """The committed steps in the shared checkpoint directory, as `zerowait ckpt ls` says."""
        listed = self.cluster.run(0, [self.cli, "ckpt", "ls", self.ckpt, "--json"])
        return json.loads(listed.stdout)["steps"]


def exactly_once(job: Job, epochs: int) -> None:
    trained = multinode_train.trained_keys(job.out)
    assert sorted(trained) == list(range(epochs))
    for epoch in range(epochs):
        assert sorted(trained[epoch]) == EVERYTHING, f"epoch {epoch}"


def assert_whole_parts(job: Job) -> None:
    """Every committed step holds every rank's part, and reads back intact."""
    for step in job.committed():
        assert step["world_size"] == WORLD, step
        parts = sorted(p.name for p in (job.ckpt / f"step-{step['step']}").glob("rank-*.json"))
        assert len(parts) == WORLD, f"step {step['step']}: {parts}"
    job.cluster.run(0, [job.cli, "ckpt", "verify", job.ckpt], timeout=120)


def node_pids(cluster, node: int) -> List[int]:
    listed = subprocess.run(["ip", "netns", "pids", f"{cluster.name}-{node}"], timeout=10,
                            capture_output=True, text=True, check=True)
    return [int(p) for p in listed.stdout.split()]


# --- a node killed --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_node_killed_mid_epoch_resumes_from_the_last_commit_and_trains_every_sample_once(
        make_cluster, tmp_path, cli):
    cluster = make_cluster(NODES)
    job = Job(cluster, tmp_path, cli, max_restarts=2,
              train_args=["--epochs", 2, "--step-sleep", 0.5, "--timeout", 60])
    job.start_all()
    kill_after = 5  # mid-epoch 0, past the commit of step 4
    job.wait_for_step(kill_after, timeout=180)
    # Node 1 fails as a machine does: every process on it at once, torchrun's agent included.
    pids = node_pids(cluster, 1)
    assert pids, "no process on node 1"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    before = job.keys()
    assert job.procs[1].wait(timeout=30) != 0
    # The node comes back (as a scheduler would start it again) and joins the next round.
    job.start(1)
    codes = job.wait(timeout=300)
    assert codes == dict.fromkeys(range(NODES), 0), f"{codes}\n{job.outputs()}"

    lines = job.keys()
    first_attempt = min(line["attempt"] for line in lines)
    later = [line for line in lines if line["attempt"] != first_attempt]
    assert len({line["attempt"] for line in later}) == 1, "more than one restart"
    resumed = min(line["step"] for line in later) - 1
    out0 = job.output(0)
    assert f"resumed from step {resumed} (epoch 0)" in out0, out0[-3000:]
    # The survivors' torchrun restarted their workers; node 1's is the new agent's first.
    assert {line["restart"] for line in later} == {0, 1}
    # The step resumed from is the newest one committed before the kill: the checkpoint of
    # every CKPT_EVERY steps that all ranks had passed.
    last_before = max(line["step"] for line in before if line["attempt"] == first_attempt)
    committed = [s["step"] for s in job.committed()]
    assert resumed in committed and resumed % CKPT_EVERY == 0
    assert not [s for s in committed if resumed < s <= last_before - CKPT_EVERY], committed

    exactly_once(job, 2)
    # What was trained twice: the first attempt's steps after the one resumed from, no more.
    raw = [k for line in lines for k in line["keys"]]
    retrained = [k for line in lines if line["attempt"] == first_attempt
                 and line["step"] > resumed for k in line["keys"]]
    assert len(raw) == 2 * SAMPLES + len(retrained)
    restart_s = min(line["time"] for line in later) - killed_at
    print(f"\nkilled node 1 after step {last_before}; resumed from step {resumed}; "
          f"{len(retrained)} samples trained again (steps {resumed + 1}..{last_before}); "
          f"first step of the new attempt {restart_s:.1f} s after the kill")
    assert_whole_parts(job)


# --- a node cut off -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_node_cut_off_fails_the_others_within_the_timeout_naming_what_timed_out(
        make_cluster, tmp_path, cli):
    cluster = make_cluster(NODES)
    timeout = 20
    job = Job(cluster, tmp_path, cli, max_restarts=0,
              train_args=["--epochs", 2, "--step-sleep", 0.5, "--timeout", timeout])
    job.start_all()
    job.wait_for_step(3, timeout=180)
    job.wait_for_commit(CKPT_EVERY, timeout=60)  # a commit before the cut, to check it stays whole
    # The host's end of node 2's link: node 2 keeps running, it only stops hearing the others.
    subprocess.run(["ip", "link", "set", f"{cluster.name}v2", "down"], check=True, timeout=10)
    cut_at = time.monotonic()
    ended: Dict[int, float] = {}
    for node in (0, 1):  # the two nodes still linked
        try:
            job.procs[node].wait(timeout=max(0.1, timeout + 60 - (time.monotonic() - cut_at)))
            ended[node] = time.monotonic() - cut_at
        except subprocess.TimeoutExpired:
            pass
    logged = job.keys()
    last_step = {r: max(line["step"] for line in logged if line["rank"] == r)
                 for r in range(WORLD)}
    # Never a hang: every rank, the cut-off node's included, fails within the timeout, with
    # margin for torchrun to tear its workers down on two busy cores. (Node 2's torchrun agent
    # itself waits on the unreachable rendezvous store until the link is back.)
    assert sorted(ended) == [0, 1], f"{ended}\n{job.outputs()}"
    named = {}
    for node in range(NODES):
        errors = [line for line in job.output(node).splitlines()
                  if "all_reduce of the gradients of step" in line or "not committed" in line]
        assert errors, f"node {node} named no collective or commit:\n{job.output(node)[-4000:]}"
        named[node] = errors[-1]
    for node in (0, 1):
        assert job.procs[node].returncode != 0
    print(f"\ncut node 2 after step {min(last_step.values())}; torchrun ended "
          + ", ".join(f"node {n} after {s:.1f} s" for n, s in sorted(ended.items())))
    for node, error in named.items():
        print(f"node {node}: {error[:400]}")
    subprocess.run(["ip", "link", "set", f"{cluster.name}v2", "up"], check=True, timeout=10)
    assert job.wait(timeout=60)[2] != 0
    # No step committed without every rank's part: nothing past what every rank trained, and
    # each committed step whole.
    committed = [s["step"] for s in job.committed()]
    assert committed and max(committed) <= min(last_step.values()), (committed, last_step)
    assert_whole_parts(job)


# --- the object store stalled ---------------------------------------------------------------

STALL_S = 30


def rgw_pid(cluster) -> int:
    return int((cluster.dir / "s3" / "run" / "client.rgw.a.pid").read_text())


def stall_store(cluster, seconds: float) -> threading.Timer:
    """Stops the S3 server (SIGSTOP) now and lets it go on (SIGCONT) after `seconds`: its
    sockets keep accepting, nothing answers."""
    pid = rgw_pid(cluster)
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
    resume.start()
    return resume


# One rank's loader as the example makes it, with a cache too small to read the share ahead.
READER = """
import sys, time, zerowait
loader = zerowait.Loader(sys.argv[1], batch_size=4, shuffle="block", block_bytes=256 << 10,
                         nodes=3, node=0, rank=0, world_size=2, threads=1, prefetch=1,
                         keys=True, fields=["x"], read_timeout=float(sys.argv[2]),
                         cache_bytes=24 << 20, **({"cache_dir": False} if sys.argv[3] == "no"
                                                  else {}))
batches = iter(loader)
next(batches)
print("first batch", flush=True)
sys.stdin.readline()  # the store is stalled now
started = time.monotonic()
try:
    for _ in batches:
        pass
    print(f"epoch complete after {time.monotonic() - started:.1f} s", flush=True)
except Exception as error:
    print(f"{type(error).__name__} after {time.monotonic() - started:.1f} s: {error}", flush=True)
"""


@pytest.mark.parametrize("cache", ["cache", "no"])
def test_a_stalled_store_fails_a_read_at_its_deadline_naming_object_and_range(
        make_cluster, tmp_path, cache):
    cluster = make_cluster(1)
    bucket = "zw-" + uuid.uuid4().hex[:16]
    create_bucket(cluster.s3, bucket)
    cluster.run(0, [sys.executable, EXAMPLE, "generate", "--out", f"s3://{bucket}/ds",
                    "--samples", SAMPLES], timeout=180)
    deadline = 6
    reader = cluster.popen(0, [sys.executable, "-c", READER, f"s3://{bucket}/ds", deadline,
                               cache], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    assert reader.stdout.readline().strip() == "first batch"
    resume = stall_store(cluster, STALL_S)
    try:
        reader.stdin.write("\n")
        reader.stdin.flush()
        said, _ = reader.communicate(timeout=deadline + 30)
    finally:
        resume.cancel()
        os.kill(rgw_pid(cluster), signal.SIGCONT)
    print(f"\n{cache}: {said.strip()}")
    assert "DeadlineExceededError after" in said, said
    took = float(said.split("DeadlineExceededError after ")[1].split()[0])
    assert took < deadline + 10, said  # the deadline, not the stall, ended the read
    assert f"s3://{bucket}/ds/" in said and ".zws" in said, said
    if cache == "no":
        assert "(bytes=" in said, said  # the GET's range
    else:
        # The read's own GET of the cache block (its range), or, when a downloader had that
        # block under way, the block the read waited for: which one is a matter of timing.
        assert "(bytes=" in said or "block " in said, said


@pytest.mark.slow
def test_a_store_stalled_mid_epoch_for_30_s_delays_the_job_and_every_sample_is_trained_once(
        make_cluster, tmp_path, cli):
    cluster = make_cluster(NODES)
    # Reads may take 60 s: each stalled request is given up after 10 s without a byte and
    # retried (docs/remote.md), and the fourth attempt meets the store again.
    job = Job(cluster, tmp_path, cli, max_restarts=0,
              train_args=["--epochs", 2, "--step-sleep", 0.5, "--timeout", 120,
                          "--read-timeout", 60, "--prefetch", 1, "--cache-bytes", 24 << 20],
              mirror=True)
    job.start_all()
    job.wait_for_step(2, timeout=180)
    stalled_at = time.time()
    resume = stall_store(cluster, STALL_S)
    try:
        codes = job.wait(timeout=300)
    finally:
        resume.cancel()
        os.kill(rgw_pid(cluster), signal.SIGCONT)
    assert codes == dict.fromkeys(range(NODES), 0), f"{codes}\n{job.outputs()}"
    exactly_once(job, 2)
    lines = job.keys()
    assert len({line["attempt"] for line in lines}) == 1  # no restart: the reads waited
    # The longest gap between two steps of a rank spans the stall.
    gaps = []
    for rank in range(WORLD):
        times = sorted(line["time"] for line in lines if line["rank"] == rank)
        gaps.append(max(b - a for a, b in zip(times, times[1:])))
    during = [line for line in lines if stalled_at < line["time"] < stalled_at + STALL_S - 5]
    print(f"\nstore stalled {STALL_S} s after step 2; longest pause between steps "
          f"{min(gaps):.1f}-{max(gaps):.1f} s over the ranks; {len(during)} rank-steps "
          "trained during the stall")
    assert max(gaps) > STALL_S - 10, gaps
    job.cluster.run(0, [cli, "ckpt", "verify", f"s3://{job.bucket}/ckpt"], timeout=120)


# --- a rank that loses contact during a commit ----------------------------------------------

# Two ranks save step 1 with a Checkpointer; rank 1 loses contact after every rank's part is
# durable, in the broadcast that tells the ranks rank 0's outcome (as node 2's ranks did when
# its link went down in the middle of step 2's commit above). Each rank prints what save() said.
LOSES_OUTCOME = """
import json, os, sys
from datetime import timedelta
import torch
import torch.distributed as dist
import zerowait
dist.init_process_group("gloo", timeout=timedelta(seconds=10))
rank = dist.get_rank()
ckpt = zerowait.Checkpointer(sys.argv[1], commit_timeout=5)
if rank == 1:
    def lost(*args, **kwargs):
        raise RuntimeError("injected: the link went down before rank 0's outcome arrived")
    dist.broadcast_object_list = lost
try:
    ckpt.save(1, {"w": torch.full((4,), float(rank))}, blocking=True)
    said = "committed"
except Exception as error:
    said = f"{type(error).__name__}: {error}"
print(json.dumps({"rank": rank, "said": said}), flush=True)
os._exit(0)
"""


def test_a_rank_that_loses_contact_after_the_parts_are_in_never_hears_a_false_not_committed(
        tmp_path):
    from helpers import start_ranks

    script = tmp_path / "loses_outcome.py"
    script.write_text(LOSES_OUTCOME)
    ckpt = tmp_path / "ckpt"
    procs = start_ranks(script, [ckpt], 2)
    said = {}
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        report = json.loads(out.strip().splitlines()[-1])
        said[report["rank"]] = report["said"]
    assert said[0] == "committed"
    assert (ckpt / "step-1" / "manifest.json").exists(), said  # rank 0 committed it whole
    assert "step 1 was not committed" not in said[1], said[1]
    assert "step 1 may or may not be committed" in said[1], said[1]
