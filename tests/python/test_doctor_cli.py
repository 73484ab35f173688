"""`zerowait doctor` as a user runs it: the JSON schema, the exit status, and planted problems in a
fixture machine (its /proc, /sys and facts under --root) flagged with evidence and a fix. The
checks themselves are tested one by one in tests/test_doctor_*.cpp."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

FINDING_KEYS = ["check", "area", "subject", "status", "summary", "evidence", "why", "fix"]


def run_doctor(cli: Path, *args: str) -> tuple[int, dict]:
    done = subprocess.run([str(cli), "doctor", *args, "--json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode, json.loads(done.stdout)


def check_schema(report: dict) -> None:
    assert report["schema"] == "zerowait.doctor/1"
    assert list(report["counts"]) == ["fail", "warn", "info", "ok"]
    assert sum(report["counts"].values()) == len(report["findings"])
    assert report["failed"] == (report["counts"]["fail"] > 0)
    assert report["seconds"] >= 0
    for finding in report["findings"]:
        assert list(finding) == FINDING_KEYS
        assert finding["status"] in ("ok", "info", "warn", "fail")
        assert finding["check"].startswith(finding["area"] + ".")
        assert finding["summary"], finding


def write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def planted_machine(root: Path) -> None:
    """A machine with one problem per area: NFS v3 with 64 KiB rsize, THP always, ulimit -n 1024
    for 16 workers, io_uring disabled, NCCL_SOCKET_IFNAME naming a missing interface."""
    write(root, "/proc/self/mountinfo",
          "22 1 0:21 / / rw,relatime - ext4 /dev/vda1 rw\n"
          "40 22 0:53 / /data rw,relatime - nfs filer:/export rw,vers=3,rsize=65536,"
          "wsize=65536,hard,proto=tcp,addr=10.0.0.5\n")
    (root / "data").mkdir()
    write(root, "/proc/meminfo", "MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\n"
          "SwapTotal: 0 kB\nSwapFree: 0 kB\n")
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n")
    write(root, "/proc/sys/kernel/io_uring_disabled", "2\n")
    write(root, "/sys/class/net/eth0/mtu", "1500\n")
    write(root, "/sys/class/net/eth0/operstate", "up\n")
    write(root, "/zerowait-facts.json", json.dumps({
        "open_files": [1024, 4096],
        "io_uring": "EPERM: io_uring_setup(4 entries): Operation not permitted",
        "env": {"NCCL_SOCKET_IFNAME": "ib0"},
    }))


def test_planted_problems_are_flagged_with_evidence_and_fix(cli, tmp_path):
    root = tmp_path / "machine"
    root.mkdir()
    planted_machine(root)
    code, report = run_doctor(cli, "/data", "--root", str(root), "--workers", "16")
    check_schema(report)
    assert code == 3 and report["failed"]
    by_check = {}
    for finding in report["findings"]:
        by_check.setdefault(finding["check"], []).append(finding)
    planted = {
        "storage.nfs_version": ("warn", "vers=3"),
        "storage.nfs_rsize_wsize": ("warn", "65536"),
        "memory.thp_enabled": ("warn", "always"),
        "limits.open_files": ("fail", "1024"),
        "io_uring.sysctl": ("fail", "io_uring_disabled"),
        "network.nccl_socket_ifname": ("fail", "ib0"),
    }
    for check, (status, evidence) in planted.items():
        assert check in by_check, f"{check} missing from {sorted(by_check)}"
        finding = by_check[check][0]
        assert finding["status"] == status, finding
        assert evidence in finding["evidence"], finding
        assert finding["why"] and finding["fix"], finding
    assert by_check["storage.nfs_version"][0]["subject"] == "/data"


def test_text_output_shows_each_problem_with_its_fix(cli, tmp_path):
    root = tmp_path / "machine"
    root.mkdir()
    planted_machine(root)
    done = subprocess.run([str(cli), "doctor", "/data", "--root", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "FAIL" in done.stdout and "fix: " in done.stdout and "evidence: " in done.stdout
    assert "vers=3" in done.stdout


def test_the_live_machine(cli, tmp_path):
    code, report = run_doctor(cli, str(tmp_path))
    check_schema(report)
    assert code == (3 if report["failed"] else 0)
    areas = {finding["area"] for finding in report["findings"]}
    assert {"storage", "memory", "limits", "cpu", "io_uring", "devices", "network"} <= areas
    storage = [f for f in report["findings"] if f["area"] == "storage"]
    assert all(f["subject"] == str(tmp_path) for f in storage)


def test_bad_flags_are_usage_errors(cli):
    done = subprocess.run([str(cli), "doctor", "--workers", "0"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--workers" in done.stderr
