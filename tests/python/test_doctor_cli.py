"""`zerowait doctor` as a user runs it: the JSON schema, the exit status, and planted problems in a
fixture machine (its /proc, /sys and facts under --root) flagged with evidence and a fix. The
checks themselves are tested one by one in tests/test_doctor_*.cpp."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FINDING_KEYS = ["check", "area", "subject", "status", "summary", "evidence", "why", "fix"]


def run_doctor(cli: Path, *args: str, prefix: tuple = ()) -> tuple[int, dict]:
    """The exit status and the JSON report, its schema checked."""
    # Another user (`prefix`) gets a HOME it cannot read, as such a user would.
    env = dict(os.environ, HOME="/nonexistent") if prefix else None
    start = time.monotonic()
    done = subprocess.run([*prefix, str(cli), "doctor", *args, "--json"], capture_output=True,
                          text=True, timeout=120, env=env)
    lived = time.monotonic() - start
    assert done.returncode in (0, 3), done.stderr
    report = json.loads(done.stdout)
    check_schema(report, lived)
    return done.returncode, report


def check_schema(report: dict, lived: float) -> None:
    """`lived`: how long the doctor's process ran, timed around it."""
    assert report["schema"] == "zerowait.doctor/1"
    assert list(report["counts"]) == ["fail", "warn", "info", "ok"]
    assert sum(report["counts"].values()) == len(report["findings"])
    assert report["failed"] == (report["counts"]["fail"] > 0)
    # The doctor's own clock runs inside its process: it read something, so more than 0, and
    # no more than the process lived. (Its bound under a stuck read: test_stuck_filesystem.py.)
    assert 0 < report["seconds"] <= lived, (report["seconds"], lived)
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
    assert code == (3 if report["failed"] else 0)
    areas = {finding["area"] for finding in report["findings"]}
    assert {"storage", "memory", "limits", "cpu", "io_uring", "devices", "network"} <= areas
    storage = [f for f in report["findings"] if f["area"] == "storage"]
    assert all(f["subject"] == str(tmp_path) for f in storage)


def test_bad_flags_are_usage_errors(cli):
    done = subprocess.run([str(cli), "doctor", "--workers", "0"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--workers" in done.stderr


def test_a_path_that_does_not_exist_is_a_usage_error(cli, tmp_path):
    missing = tmp_path / "no" / "such"
    for args in ([str(missing)], [str(tmp_path), str(missing)], [str(missing), "--json"]):
        done = subprocess.run([str(cli), "doctor", *args], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stdout == ""
        assert done.stderr == (f"zerowait: error: '{missing}' does not exist: give the directory "
                               "the job reads data from or writes checkpoints to\n")


def test_a_file_is_checked_for_its_file_system_and_not_sampled_as_a_tree(cli, tmp_path):
    # Many small files beside it: its directory's tree is not what was asked about.
    for i in range(1200):
        (tmp_path / f"{i}.jpg").write_bytes(b"x" * 100)
    shard = tmp_path / "train.zws"
    shard.write_bytes(b"z" * 4096)
    code, report = run_doctor(cli, str(shard))
    storage = {f["check"]: f for f in report["findings"] if f["area"] == "storage"}
    assert "storage.mount" in storage or "storage.o_direct" in storage, sorted(storage)
    small = storage["storage.small_files"]
    assert small["status"] == "info"
    assert small["summary"] == "not checked: a file, not a directory of samples"
    assert f"the file system holding {shard}" in small["evidence"]
    assert not any("zerowait pack" in f["fix"] for f in report["findings"]), report


ESTIMATE = re.compile(r"estimated (\d+\.\d) x from packing \(per-file overhead (\d+(?:\.\d)?) % "
                      r"of read time, measured on (\d+) files, page cache as found\)")


def test_the_packing_estimate_is_its_formula_over_the_planted_small_files(cli, tmp_path,
                                                                         ground_truth):
    # The planted cause: 1,200 tiny files of known sizes (2,000..3,199 B, one each) in 4 class
    # folders on a real file system, so one open/fstat/close per file is most of each read.
    tree = tmp_path / "train"
    sizes = list(range(2000, 3200))
    for i, size in enumerate(sizes):
        folder = tree / f"class_{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.jpg").write_bytes(os.urandom(size))
    _, report = run_doctor(cli, str(tree))
    small = next(f for f in report["findings"] if f["check"] == "storage.small_files")
    assert small["status"] == "warn", small

    # The estimate is a model (docs/doctor.md): on up to 200 of the files, evenly spread,
    # open+fstat+close is timed apart from the read, and the gain is total / (total - per-file),
    # i.e. 1 / (1 - share). Its inputs must be what was planted: every file counted, the
    # median of the planted sizes, 200 files measured (1,200 / 200 = every 6th: 200 of them,
    # ~0.5 MiB, far inside 64 MiB and the 0.5 s bound unless a loaded machine stops it early).
    median = sorted(sizes)[len(sizes) // 2]
    assert small["summary"].startswith(f"1,200 files with a median of {median / 1024:.2f} KiB: "
                                       "estimated "), small
    assert (f"sampled 1,200 files in 5 directories under {tree} breadth-first (all of them), "
            f"median {median / 1024:.2f} KiB, 100 % under 1 MiB") in small["evidence"], small
    found = ESTIMATE.search(small["evidence"])
    assert found, small["evidence"]
    gain, share, measured = float(found[1]), float(found[2]) / 100, int(found[3])
    assert 1 <= measured <= 200
    assert f"estimated {found[1]} x from packing" in small["summary"]
    # Its output follows the formula: the share is printed to 1 % (0.1 % under 10 %) and the
    # gain to 0.1, so the gain must lie within the formula over the share's rounding interval,
    # widened by the gain's own rounding.
    step = 0.001 if share < 0.1 else 0.01
    low, high = share - step / 2, min(share + step / 2, 0.9999)
    formula, lowest, highest = 1 / (1 - share), 1 / (1 - low) - 0.05, 1 / (1 - high) + 0.05
    ground_truth("doctor: packing estimate against 1 / (1 - its measured per-file share), "
                 "1,200 planted files", formula, gain, within=(formula - lowest, highest - formula))
    assert lowest <= gain <= highest, (gain, share)
    # What was planted makes the per-file share real: open, fstat and close are not free.
    assert share > 0, small
    assert small["fix"] == (f"zerowait pack {tree} -o {tree}.zw, then zerowait bench files {tree} "
                            f"--dataset {tree}.zw to measure the gain")


# Tests run as root in CI: an unprivileged user is nobody, through setpriv (util-linux).
UNPRIVILEGED = (["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                 "--"] if os.geteuid() == 0 else [])
# Absolute paths in a finding's evidence ("/proc/meminfo: ...", "statvfs(/data): ...").
EVIDENCE_PATH = re.compile(r"(?<![\w.])/(?:proc|sys|dev|tmp|data|home|var|run)[^\s:;,()'\"]*")


def unreadable_as_user(paths: list[str]) -> set[str]:
    """Which of `paths` the unprivileged user may not read (or list, for a directory)."""
    probe = ("import os, sys\n"
             "for p in sys.stdin.read().split('\\n'):\n"
             "    if not p: continue\n"
             "    try:\n"
             "        os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read(1)\n"
             "    except PermissionError:\n"
             "        print(p)\n"
             "    except OSError:\n"
             "        pass\n")
    done = subprocess.run(UNPRIVILEGED + [sys.executable, "-c", probe], input="\n".join(paths),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_an_unprivileged_user_never_gets_ok_for_what_it_could_not_read(cli):
    # In /tmp itself: pytest's tmp_path lies under a directory only its owner may enter.
    base = Path(tempfile.mkdtemp(prefix="zerowait-doctor-"))
    try:
        base.chmod(0o755)
        open_dir, private = base / "open", base / "private"
        for directory in (open_dir, private):
            directory.mkdir()
            for i in range(3):
                (directory / f"{i}.jpg").write_bytes(b"x" * 100)
                (directory / f"{i}.jpg").chmod(0o644)
            directory.chmod(0o755)
        private.chmod(0o700 if os.geteuid() == 0 else 0)  # root's own: nobody may list it
        _, report = run_doctor(cli, str(open_dir), str(private), prefix=tuple(UNPRIVILEGED))
        findings = report["findings"]

        # The private directory is reported as unreadable, with the fix, and not judged.
        about_private = {f["check"]: f for f in findings if f["subject"] == str(private)}
        for check in ("storage.small_files", "storage.o_direct"):
            f = about_private[check]
            assert f["status"] == "info", f
            assert "not readable as this user" in f["summary"] and str(private) in f["summary"]
            assert "root" in f["fix"], f
        assert about_private["storage.mount"]["status"] == "info"
        about_open = {f["check"]: f for f in findings if f["subject"] == str(open_dir)}
        assert about_open["storage.small_files"]["status"] == "ok", about_open

        # No "ok" rests on a path this user could not read. statvfs(PATH) reads no file: it
        # needs only to reach PATH, so the free space of a private directory is known.
        ok_paths = {p for f in findings if f["status"] == "ok"
                    for p in EVIDENCE_PATH.findall(re.sub(r"statvfs\([^)]*\)", "", f["evidence"]))
                    if "*" not in p}
        assert ok_paths, "no ok finding names its evidence"
        assert unreadable_as_user(sorted(ok_paths)) == set()
        # And every finding that says it could not read names a path the user indeed cannot.
        said = [f for f in findings if "not readable as this user" in f["summary"]]
        assert said and all(f["status"] == "info" for f in said)
        denied = {p for f in said for p in EVIDENCE_PATH.findall(f["evidence"])}
        assert str(private) in denied
        assert unreadable_as_user(sorted(denied)) == denied
    finally:
        shutil.rmtree(base, ignore_errors=True)
