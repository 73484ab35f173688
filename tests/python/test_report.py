"""`zerowait report` rendered by a real browser: a run directory built here the way
docs/observe.md says producers write it, drawn by the command, then loaded in headless Chromium.
The DOM Chromium builds must hold the sections, the SVG shapes and the verdict; the screenshot
must be a real PNG of the size asked for. tests/test_report.cpp counts bars and checks errors."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

CHROMIUM_TIMEOUT_S = 120
CAUSES = ["input", "checkpoint", "h2d", "communication", "compute", "other"]
STEPS = 120
RANKS = 2


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no chromium: scripts/setup.sh installs Debian's chromium for this test")
    return path


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with a profile of its own, so parallel runs do not collide."""
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
               f"--user-data-dir={profile}", *args]
    done = subprocess.run(command, capture_output=True, timeout=CHROMIUM_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done


def write_run(run: Path) -> None:
    """An emulate run: four configurations (one below the floor), two ranks, disk and memory
    samples every 0.1 s, two events, a cost and a comparison, doctor findings."""
    run.mkdir()
    (run / "run.json").write_text(json.dumps({
        "schema": "zerowait.run/1",
        "kind": "emulate",
        "title": "resnet50 on /data, 4 accelerators (h100) <fixture>",
        "command": ["zerowait", "emulate", "resnet50", "--data", "/data", "--accelerators", "4"],
        "started_unix": 1796284800.0,
        "duration_s": STEPS * 0.25,
        "causes": CAUSES,
        "seconds": {"input": 5.9, "checkpoint": 0.6, "h2d": 0.2, "communication": 1.6,
                    "compute": 19.6, "other": 2.1},
        "shares": {"input": 0.198, "checkpoint": 0.020, "h2d": 0.007, "communication": 0.054,
                   "compute": 0.654, "other": 0.067},
        "verdict": "input-bound",
        "au": {"value": 0.654, "floor": 0.90, "pass": False, "steps": STEPS,
               "rule": "compute / wall over all steps but the first (MLPerf Storage)"},
        "throughput": {"samples_per_s": 1790.0, "mb_per_s": 205.2},
        "cost": {"gpus": 8, "gpu_hourly_cost": 2.0,
                 "per_day": {c: round(s * 8 * 2.0 * 24, 2) for c, s in
                             [("input", 0.198), ("checkpoint", 0.02), ("h2d", 0.007),
                              ("communication", 0.054), ("compute", 0.654), ("other", 0.067)]},
                 "per_year": {"input": 27751.7, "compute": 91664.6},
                 "wait_per_day": 133.0, "wait_per_year": 48545.0},
        "comparison": {"before": "runs/before", "saving_share": 0.31, "saving_per_day": 119.0,
                       "saving_per_year": 43435.0},
        "events": [{"t": 1010.0, "what": "compute share fell from 0.92 to 0.20",
                    "before": "disk queue 131 on vda; 3 threads blocked on I/O"},
                   {"t": 1020.0, "what": "checkpoint save started"}],
        "rows": [
            {"input": "zerowait", "accelerators": 4, "au": 0.93, "floor": 0.9, "pass": True,
             "samples_per_s": 1790.0, "mb_per_s": 205.2},
            {"input": "pytorch", "accelerators": 4, "au": 0.41, "floor": 0.9, "pass": False,
             "samples_per_s": 790.0, "mb_per_s": 90.5},
            {"input": "zerowait", "accelerators": 8, "au": 0.91, "floor": 0.9, "pass": True,
             "samples_per_s": 3510.0, "mb_per_s": 402.4},
            {"input": "pytorch", "accelerators": 8, "au": 0.22, "floor": 0.9, "pass": False,
             "samples_per_s": 820.0, "mb_per_s": 94.0},
        ],
        "doctor": [
            {"check": "storage.atime", "severity": "warn",
             "summary": "/data mounted with atime: every read writes an inode"},
            {"check": "storage.readahead", "severity": "fail",
             "summary": "readahead 128 KiB on vda", "subject": "/dev/vda"},
            {"check": "memory.swap", "severity": "ok", "summary": "no swap"},
        ],
    }))
    with open(run / "steps.jsonl", "w") as f:
        for step in range(STEPS):
            # Input stalls grow in the middle third, the way a cold cache shows.
            stall = 0.15 if STEPS // 3 <= step < 2 * STEPS // 3 else 0.02
            for rank in range(RANKS):
                f.write(json.dumps({
                    "step": step, "rank": rank, "t": 1000 + 0.25 * step, "wall": 0.25,
                    "input": stall, "checkpoint": 0.0, "h2d": 0.002, "communication": 0.01,
                    "compute": 0.25 - stall - 0.018, "other": 0.006, "samples": 400,
                    "bytes": 45864000}) + "\n")
    with open(run / "system.jsonl", "w") as f:
        for i in range(STEPS * 25 // 10):
            t = 1000 + 0.1 * i
            cold = 10 <= t - 1000 < 20
            f.write(json.dumps({
                "t": t, "cpu": 0.35 if cold else 0.7, "proc_cpu": 1.3, "rss": 812000000 + i * 1e6,
                "mem_available": 20100000000 - i * 1e7, "swap_in": 0, "swap_out": 0,
                "read_bps": 210000000 if cold else 60000000, "write_bps": 1000000,
                "disk": {"vda": {"busy": 0.95 if cold else 0.3, "queue": 31.2 if cold else 2.0,
                                 "await_ms": 1.9, "read_bps": 209000000, "write_bps": 0}},
                "threads": {"running": 2, "io": 1, "sleeping": 9}, "gpu_util": None}) + "\n")


@pytest.fixture()
def report(cli: Path, tmp_path: Path) -> tuple[Path, dict]:
    run = tmp_path / "run"
    write_run(run)
    page = tmp_path / "report.html"
    done = subprocess.run([str(cli), "report", str(run), "-o", str(page), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return page, json.loads(done.stdout)


def test_the_command_names_the_page_and_its_sections(report):
    page, out = report
    assert out["report"] == str(page)
    assert out["sections"] == ["summary", "where-time-went", "au", "timeline", "money", "doctor"]
    html = page.read_text()
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "&lt;fixture&gt;" in html


def test_chromium_renders_every_section_and_shape(report, tmp_path):
    page, out = report
    dom = run_chromium(tmp_path, "--dump-dom", page.as_uri()).stdout.decode()
    for section in out["sections"]:
        assert f'id="{section}"' in dom, section
    assert "Input-bound" in dom
    assert dom.count("<svg") >= 8
    # Timeline: rank 0's steps, one group each; the shares bar plus one per row.
    assert len(re.findall(r'<g class="bar">', dom)) == STEPS + 1 + 4
    assert len(re.findall(r'<rect class="au-bar (?:pass|fail)"', dom)) == 4
    assert len(re.findall(r'<line class="floor"', dom)) == 4
    assert len(re.findall(r'<line class="event"', dom)) == 2
    # disk busy, queue, read, write, rss, available, cpu, process cpu.
    assert len(re.findall(r"<polyline ", dom)) == 8
    assert dom.count("<rect ") > STEPS * 4
    assert "Rank 0 of 2 ranks is shown." in dom
    assert "$43,435/year saved" in dom


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_chromium_screenshot_has_the_window_size(report, tmp_path):
    page, _ = report
    shot = tmp_path / "report.png"
    run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000",
                 "--hide-scrollbars", page.as_uri())
    assert shot.stat().st_size > 10_000
    assert png_size(shot) == (1280, 2000)
