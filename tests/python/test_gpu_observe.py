"""The diagnosis half on a real GPU: the system sampler (StepProfiler and watch) reads the GPU's
utilisation and memory through NVML, and the doctor names the GPU, its PCIe link against the
most it can do, and its NUMA node. Marked ``gpu``: they skip, saying why, without a CUDA device
(scripts/gpu-check.sh runs them on the GPU machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import zerowait

pytestmark = pytest.mark.gpu

# A job that keeps the GPU busy for ~3 s with 2 GiB of its memory in use.
GPU_JOB = textwrap.dedent("""
    import time, torch
    x = torch.randn(8192, 8192, device="cuda")
    hold = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    end = time.monotonic() + 3
    while time.monotonic() < end:
        y = x @ x
        torch.cuda.synchronize()
""")


def test_the_profiler_samples_gpu_utilisation_and_memory():
    x = torch.randn(8192, 8192, device="cuda")
    hold = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    prof = zerowait.StepProfiler(interval=0.05)
    end = time.monotonic() + 2
    while time.monotonic() < end:
        with prof.step():
            (x @ x).sum().item()
    prof.close()
    samples = prof.system_samples()
    assert samples, "no system samples"
    utilisation = [s["gpu_util"] for s in samples if s["gpu_util"] is not None]
    memory = [s["gpu_mem"] for s in samples if s["gpu_mem"] is not None]
    assert utilisation and max(utilisation) > 0, samples[:3]
    assert memory and min(memory) >= hold.numel(), (memory[:3], hold.numel())


def test_watch_reads_the_gpu_of_the_job_it_watches(cli, tmp_path):
    job = tmp_path / "gpu_job.py"
    job.write_text(GPU_JOB)
    run = tmp_path / "run"
    done = subprocess.run([str(cli), "watch", "--out", str(run), "--", sys.executable, str(job)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    samples = [json.loads(line) for line in (run / "system.jsonl").read_text().splitlines()]
    assert any((s["gpu_util"] or 0) > 0.5 for s in samples), [s["gpu_util"] for s in samples]
    assert any((s["gpu_mem"] or 0) >= 2 << 30 for s in samples), [s["gpu_mem"] for s in samples]


def test_the_doctor_names_the_gpu_its_link_and_numa_node(cli):
    done = subprocess.run([str(cli), "doctor", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode in (0, 3), done.stderr
    findings = json.loads(done.stdout)["findings"]
    links = [f for f in findings if f["check"] == "devices.gpu_link"]
    name = torch.cuda.get_device_name(0)
    assert links, [f["summary"] for f in findings if f["area"] == "devices"]
    summary = links[0]["summary"]
    assert name in summary and "PCIe Gen" in summary and " x" in summary, summary
    assert "NUMA node" in summary, summary
    assert "CurrPcieLinkGeneration" in links[0]["evidence"], links[0]
