"""`zerowait watch` on real processes: a job made input-bound (a DataLoader's shape: a worker
process reads files and sleeps, feeding the main process through a multiprocessing queue) and a
compute-bound one; the run directory they leave (docs/observe.md); --compare of the two; --pid;
the exit status and signals passed through; and the errors. Also the Python side of the cost
arithmetic and the system sampler."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from zerowait import _core

CAUSES = ["input", "checkpoint", "communication", "compute", "other"]
SAMPLE_KEYS = ["t", "cpu", "proc_cpu", "rss", "mem_available", "swap_in", "swap_out",
               "read_bps", "write_bps", "disk", "threads", "gpu_util", "gpu_mem", "main"]

# A worker produces items slowly (a file read and a 50 ms sleep each) while the main thread
# waits on the queue and then does almost nothing with them.
INPUT_BOUND = textwrap.dedent("""
    import multiprocessing as mp, os, sys, time

    def produce(queue, paths):
        for i in range(100000):
            with open(paths[i % len(paths)], "rb") as f:
                f.read()
            time.sleep(0.05)
            queue.put(i)

    if __name__ == "__main__":
        data, seconds = sys.argv[1], float(sys.argv[2])
        os.makedirs(data, exist_ok=True)
        paths = []
        for i in range(8):
            paths.append(os.path.join(data, f"item-{i}"))
            with open(paths[-1], "wb") as f:
                f.write(os.urandom(64 * 1024))
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        ctx.Process(target=produce, args=(queue, paths), daemon=True).start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            queue.get()
            sum(range(1000))
        print("input-bound job done", flush=True)
""")

# Input is ready at once; each step computes in Python, then sleeps as an accelerator would.
COMPUTE_BOUND = textwrap.dedent("""
    import queue, sys, time
    ready = queue.Queue()
    for i in range(100000):
        ready.put(i)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        ready.get()
        sum(i * i for i in range(20000))
        time.sleep(0.01)
    print("compute-bound job done", flush=True)
""")


def watch(cli: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(cli), "watch", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def read_run(run: Path) -> tuple[dict, list[dict]]:
    doc = json.loads((run / "run.json").read_text())
    samples = [json.loads(line) for line in (run / "system.jsonl").read_text().splitlines()]
    return doc, samples


def check_run(doc: dict, samples: list[dict]) -> None:
    """The run directory follows docs/observe.md."""
    assert doc["schema"] == "zerowait.run/1"
    assert doc["kind"] == "watch"
    assert doc["causes"] == CAUSES
    assert list(doc["shares"]) == CAUSES and list(doc["seconds"]) == CAUSES
    assert math.isclose(sum(doc["shares"].values()), 1.0, abs_tol=1e-3)
    # Start-up and shutdown are timed apart: the shares are of the time between.
    assert 0 <= doc["startup_s"] + doc["shutdown_s"] < doc["duration_s"]
    assert math.isclose(sum(doc["seconds"].values()) + doc["startup_s"] + doc["shutdown_s"],
                        doc["duration_s"], rel_tol=1e-2)
    assert doc["duration_s"] > 0 and doc["started_unix"] > 1.6e9
    assert doc["command"][:2] == ["zerowait", "watch"]
    assert isinstance(doc["events"], list)
    for event in doc["events"]:
        assert set(event) == {"t", "what", "before"}
    assert len(samples) >= 10
    now = time.monotonic()
    for previous, sample in zip(samples, samples[1:]):
        assert sample["t"] > previous["t"]
    for sample in samples:
        assert list(sample) == SAMPLE_KEYS
        assert sample["main"] in CAUSES
        assert 0 <= sample["cpu"] <= 1 and sample["proc_cpu"] >= 0
        assert sample["rss"] > 0 and sample["mem_available"] > 0
        assert set(sample["threads"]) == {"running", "io", "sleeping"}
        assert sample["t"] <= now  # CLOCK_MONOTONIC, the clock of time.monotonic()
        for disk in sample["disk"].values():
            assert set(disk) == {"busy", "queue", "await_ms", "read_bps", "write_bps"}
            assert 0 <= disk["busy"] <= 1


def test_input_bound_then_compute_bound_and_the_saving(cli, tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    job = script(tmp_path, "input_job.py", INPUT_BOUND)
    done = watch(cli, "--out", str(before), "--gpus", "8", "--gpu-hourly-cost", "2.0", "--",
                 sys.executable, job, str(tmp_path / "data"), "2.5")
    assert done.returncode == 0, done.stderr
    assert "input-bound job done" in done.stdout  # the job's stdout passes through
    assert "verdict: input-bound" in done.stdout
    assert "input wait costs $" in done.stdout and "on 8 GPUs at $2.00/h" in done.stdout
    doc, samples = read_run(before)
    check_run(doc, samples)
    assert doc["verdict"] == "input-bound", doc["shares"]
    assert doc["shares"]["input"] >= 0.5
    assert doc["title"] == f"{sys.executable} {job} {tmp_path / 'data'} 2.5"
    # Priced as docs/observe.md says: share x gpus x rate x 24. run.json holds shares to 4
    # decimals and money to 2, so the two sides differ by up to 384 x 0.00005 a share plus half a
    # cent (0.02 alone failed once under load: 368.66 against 0.9600 x 384 = 368.64).
    cost = doc["cost"]
    assert cost["gpus"] == 8 and cost["gpu_hourly_cost"] == 2.0
    rounding = 8 * 2 * 24 * 0.5e-4
    assert cost["per_day"]["input"] == pytest.approx(doc["shares"]["input"] * 8 * 2 * 24,
                                                     abs=rounding + 0.005 + 1e-9)
    waits = [share for cause, share in doc["shares"].items() if cause != "compute"]
    assert cost["wait_per_day"] == pytest.approx(sum(waits) * 384,
                                                 abs=len(waits) * rounding + 0.005 + 1e-9)
    assert cost["wait_per_year"] == pytest.approx(cost["wait_per_day"] * 365, abs=1)

    job = script(tmp_path, "compute_job.py", COMPUTE_BOUND)
    done = watch(cli, "--out", str(after), "--compare", str(before), "--gpus", "8",
                 "--gpu-hourly-cost", "2.0", "--", sys.executable, job, "2.5")
    assert done.returncode == 0, done.stderr
    assert "verdict: compute-bound" in done.stdout
    assert "saving: " in done.stdout and f"less GPU time than {before}" in done.stdout
    doc_after, samples = read_run(after)
    check_run(doc_after, samples)
    assert doc_after["verdict"] == "compute-bound", doc_after["shares"]
    comparison = doc_after["comparison"]
    assert comparison["before"] == str(before)
    assert comparison["basis"] == "compute share"
    expected = 1 - doc["shares"]["compute"] / doc_after["shares"]["compute"]
    assert comparison["saving_share"] == pytest.approx(expected, abs=1e-3)
    assert comparison["saving_share"] > 0.3
    assert comparison["saving_per_day"] == pytest.approx(expected * 384, abs=0.5)

    # The same comparison from Python, from the two run.json objects.
    again = _core.compare_runs(doc, doc_after, 8, 2.0, before_path=str(before))
    assert again["saving_share"] == pytest.approx(comparison["saving_share"], abs=1e-4)


DATALOADER_JOB = Path(__file__).with_name("dataloader_job.py")
# A DataLoader whose batches carry several tensors, each unpickled by the main thread through
# its own unix-socket handshake with a worker: next() waits on the workers (they sleep) and on
# the main thread's own unpickling, and both are input. 120 steps of about 90 ms, sampled every
# 20 ms: enough samples that the share's sampling error is small against the 5 points.
DATALOADER_ARGS = ["--steps", "120", "--fields", "4", "--sample-ms", "8", "--compute-ms", "40"]
# 32 tensors a batch: the main thread's unpickling (and freeing the batch before) is most of
# next(), running in user space between its reads.
MANY_TENSORS_ARGS = ["--steps", "120", "--fields", "32", "--sample-ms", "8", "--compute-ms", "40"]
POINTS = 0.05  # watch's input share within 5 points of the loop's own


def loop_figures(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("job_args", [DATALOADER_ARGS, MANY_TENSORS_ARGS],
                         ids=["4-tensors", "32-tensors"])
def test_dataloader_job_input_share_matches_the_loop_own(cli, tmp_path, job_args,
                                                         ground_truth):
    """The loop times its own wait in next(); watch, from outside, must agree within 5 points:
    start-up (importing torch, building the dataset) is left out of the shares, and the main
    thread unpickling batches counts as input, with 4 tensors a batch and with 32."""
    figures = tmp_path / "loop.json"
    done = watch(cli, "--interval", "0.02", "--out", str(tmp_path / "run"), "--",
                 sys.executable, str(DATALOADER_JOB), str(figures), *job_args,
                 timeout=300)
    assert done.returncode == 0, done.stderr
    loop = loop_figures(figures)
    doc, samples = read_run(tmp_path / "run")
    check_run(doc, samples)
    ground_truth(f"watch: input share, DataLoader job, {job_args[3]} tensors a batch",
                 loop["input_share"], doc["shares"]["input"], within=POINTS)
    assert doc["shares"]["input"] == pytest.approx(loop["input_share"], abs=POINTS), (
        doc["shares"], loop)
    # Start-up ends where the loop's clock starts (the workers start in iter(loader)).
    started = loop["loop_start_monotonic"] - samples[0]["t"]
    assert doc["startup_s"] == pytest.approx(started, abs=0.5), (doc["startup_s"], started)
    assert "are not in the shares" in done.stdout
    assert doc["degraded"] is None and doc["exit_code"] == 0 and doc["failed"] is False
    if doc["verdict"] == "input-bound":  # the verdict is followed by the change, with its number
        [advice] = doc["advice"]
        assert advice["change"] == "num_workers=2 -> 4" and advice["workers"] == 2, advice
        assert 0 <= advice["predicted_input_share"] < doc["shares"]["input"]
        assert f"change: {advice['summary']}" in done.stdout
    else:
        assert doc["advice"] == []


def start_dataloader_job(figures: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(DATALOADER_JOB), str(figures),
                             *DATALOADER_ARGS], stdout=subprocess.PIPE, text=True)


def test_pid_of_a_dataloader_job_matches_the_loop_own(cli, tmp_path, ground_truth):
    """--pid follows a job watch did not start (it attaches mid-run): the same 5 points. watch
    is not the parent: the job stays a zombie until reaped here, and watch must stop at that."""
    figures = tmp_path / "loop.json"
    job = start_dataloader_job(figures)
    try:
        done = watch(cli, "--pid", str(job.pid), "--interval", "0.02", "--out",
                     str(tmp_path / "run"), timeout=300)
    finally:
        job.communicate(timeout=300)
    assert done.returncode == 0 and job.returncode == 0, done.stderr
    loop = loop_figures(figures)
    doc, samples = read_run(tmp_path / "run")
    check_run(doc, samples)
    assert doc["title"].startswith(f"pid {job.pid}: {sys.executable}")
    assert doc["exit_code"] is None and doc["degraded"] is None
    ground_truth("watch --pid: input share, DataLoader job attached mid-run",
                 loop["input_share"], doc["shares"]["input"], within=POINTS)
    assert doc["shares"]["input"] == pytest.approx(loop["input_share"], abs=POINTS), (
        doc["shares"], loop)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to watch as another user")
def test_pid_without_ptrace_rights_is_degraded_and_says_so(cli, tmp_path):
    """watch run as an unprivileged user on root's job cannot read the main thread's system
    call: it says so once, records why in run.json, and the DataLoader's waits on its workers
    are no longer seen as input (the job's classification differs from the test above)."""
    out = Path(tempfile.mkdtemp(prefix="zw-degraded-"))
    out.chmod(0o777)
    figures = tmp_path / "loop.json"
    job = start_dataloader_job(figures)
    try:
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               str(cli), "watch", "--pid", str(job.pid), "--interval", "0.02",
                               "--out", str(out / "run")],
                              capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        job.communicate(timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("degraded: ") == 1, done.stdout
        doc, samples = read_run(out / "run")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    check_run(doc, samples)
    assert "ptrace" in doc["degraded"] and f"pid {job.pid}" in doc["degraded"]
    loop = loop_figures(figures)
    # Blocked in poll or read, the main thread is only "sleeping": other, not input.
    assert doc["shares"]["input"] < loop["input_share"] - 0.2, (doc["shares"], loop)
    assert doc["shares"]["other"] > 0, doc["shares"]


def test_a_failed_job_is_reported_failed(cli, tmp_path):
    """A job that raises after a few steps: its exit status passes through, run.json says it
    failed, and there is no verdict or price for it."""
    done = watch(cli, "--out", str(tmp_path / "run"), "--gpus", "8", "--gpu-hourly-cost", "2.0",
                 "--", sys.executable, str(DATALOADER_JOB), str(tmp_path / "loop.json"),
                 "--fail-after", "3", timeout=300)
    assert done.returncode == 1, done.stderr
    assert "failed on purpose" in done.stderr
    doc, _ = read_run(tmp_path / "run")
    assert doc["failed"] is True and doc["exit_code"] == 1
    assert doc["verdict"] == "failed" and doc["cost"] is None
    assert "the job failed: exit status 1" in done.stdout
    assert "verdict:" not in done.stdout and "$" not in done.stdout


# Compute for 1.5 s, then wait 2 s on a pipe from a child process, five times: each wait holds a
# whole one-second window with no compute, a drop.
DROPPING = textwrap.dedent("""
    import os, time
    r, w = os.pipe()
    if os.fork() == 0:
        for _ in range(5):
            time.sleep(3.5)
            os.write(w, b"x")
        os._exit(0)
    for _ in range(5):
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            pass
        os.read(r, 1)
    os.wait()
""")


def test_drops_list_as_many_as_they_say(cli, tmp_path):
    done = watch(cli, "--out", str(tmp_path / "run"), "--", sys.executable,
                 script(tmp_path, "dropping.py", DROPPING), timeout=120)
    assert done.returncode == 0, done.stderr
    doc, _ = read_run(tmp_path / "run")
    listed = [line for line in done.stdout.splitlines() if line.startswith("  at ")]
    assert len(doc["events"]) >= 4, doc["events"]
    header = f"drops (3 deepest of {len(doc['events'])}; all in run.json):"
    assert header in done.stdout, done.stdout
    assert len(listed) == 3


def test_json_output_is_run_json(cli, tmp_path):
    run = tmp_path / "run"
    done = watch(cli, "--json", "--interval", "0.05", "--out", str(run), "--",
                 sys.executable, "-c", "import time; time.sleep(0.6)")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json.loads((run / "run.json").read_text())
    assert printed["cost"] is None and printed["comparison"] is None
    assert printed["shares"]["compute"] >= 0.5  # a sleep stands for the accelerator


def test_exit_status_passes_through(cli, tmp_path):
    done = watch(cli, "--out", str(tmp_path / "a"), "--", sys.executable, "-c",
                 "import sys, time; time.sleep(0.3); sys.exit(7)")
    assert done.returncode == 7, done.stderr
    assert (tmp_path / "a" / "run.json").is_file()
    done = watch(cli, "--out", str(tmp_path / "b"), "--", sys.executable, "-c",
                 "import os, signal, time; time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)")
    assert done.returncode == 128 + signal.SIGKILL, done.stderr


def test_sigterm_reaches_the_job(cli, tmp_path):
    marker = tmp_path / "got-sigterm"
    job = script(tmp_path, "job.py", textwrap.dedent(f"""
        import signal, sys, time
        def stop(signum, frame):
            open({str(marker)!r}, "w").write(str(signum))
            sys.exit(3)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        time.sleep(30)
    """))
    process = subprocess.Popen([str(cli), "watch", "--out", str(tmp_path / "run"), "--",
                                sys.executable, job], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 3
    assert marker.read_text() == str(int(signal.SIGTERM))
    assert (tmp_path / "run" / "run.json").is_file()


def test_errors_name_the_problem(cli, tmp_path):
    cases = [
        ([], "nothing to watch"),
        (["--pid", "1", "--", "true"], "not both"),
        (["--pid", str(2**22 + 12345)], "no such process"),
        (["--", str(tmp_path / "no-such-program")], "cannot execute"),
        (["--compare", str(tmp_path), "--", "true"], "no run.json in"),
        (["--gpus", "8", "--", "true"], "--gpus and --gpu-hourly-cost go together"),
    ]
    for args, message in cases:
        done = watch(cli, "--out", str(tmp_path / "never"), *args)
        assert done.returncode == 1, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert done.stderr.startswith("zerowait: error: ")
    assert not (tmp_path / "never").exists()
    for args in (["--interval", "0", "--", "true"], ["--gpus", "0", "--", "true"],
                 ["--gpu-hourly-cost", "-2", "--gpus", "1", "--", "true"]):
        done = watch(cli, *args)
        assert done.returncode == 2, (args, done.stderr)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "run.json").write_text("{}")
    done = watch(cli, "--out", str(tmp_path / "taken"), "--", "true")
    assert done.returncode == 1 and "already holds a run" in done.stderr


def test_help_explains_with_an_example(cli):
    done = subprocess.run([str(cli), "watch", "--help"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0
    for text in ("--pid", "--compare", "--gpu-hourly-cost", "input", "checkpoint",
                 "zerowait watch --out runs/before"):
        assert text in done.stdout, text


def test_wait_cost_from_python():
    cost = _core.wait_cost({"input": 0.25, "compute": 0.75}, 4, 3.0)
    assert cost["per_day"]["input"] == pytest.approx(0.25 * 4 * 3 * 24)
    assert cost["per_year"]["compute"] == pytest.approx(0.75 * 4 * 3 * 24 * 365)
    assert cost["wait_per_day"] == pytest.approx(72.0)
    with pytest.raises(ValueError, match=r"shares\['input'\]"):
        _core.wait_cost({"input": 1.2}, 4, 3.0)
    with pytest.raises(ValueError, match="gpus"):
        _core.wait_cost({"input": 0.2}, 0, 3.0)
    with pytest.raises(ValueError, match="gpu_hourly_cost"):
        _core.wait_cost({"input": 0.2}, 1, -3.0)
    with pytest.raises(ValueError, match="shares.compute"):
        _core.compare_runs({"shares": {"compute": 2}}, {"shares": {"compute": 0.5}}, 1, 1.0)
    # Throughput wins over compute shares; a slower run is a negative saving.
    worse = _core.compare_runs({"throughput": {"samples_per_s": 100.0}},
                               {"throughput": {"samples_per_s": 80.0}}, 2, 1.0)
    assert worse["basis"] == "throughput"
    assert worse["saving_share"] == pytest.approx(-0.25)
    assert worse["saving_per_day"] == pytest.approx(-0.25 * 2 * 24)


def test_system_sampler_from_python():
    with _core.SystemSampler(interval=0.02) as sampler:
        assert sampler.running
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            sum(range(1000))
    assert not sampler.running
    samples = sampler.samples()
    assert len(samples) >= 3
    for sample in samples:
        assert list(sample) == SAMPLE_KEYS[:-1]  # no `main` outside watch
    assert sum(s["proc_cpu"] for s in samples) > 0
    assert samples[-1]["t"] <= time.monotonic()
    with pytest.raises(ValueError, match="interval"):
        _core.SystemSampler(interval=0)
    with pytest.raises(ValueError, match="pid"):
        _core.SystemSampler(pid=-5)
