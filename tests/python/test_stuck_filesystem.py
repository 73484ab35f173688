"""A stuck file system, as a hung NFS mount is: a FUSE mount (stuck_fs.py) whose reads of shard
files block on command and ignore every deadline. The loader's next(timeout=) still returns,
raising DeadlineExceededError that names the file and offset the worker is blocked on; close()
returns, leaving that worker behind; and the process ends once the mount answers. The doctor's
small-file probe abandons such a read at its time bound. Skipped where
FUSE cannot mount (no /dev/fuse, no libfuse2 or fusepy, no privilege to mount)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

STUCK_FS = Path(__file__).with_name("stuck_fs.py")


def _fuse_unavailable() -> str | None:
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse on this machine"
    try:
        import fuse  # noqa: F401  (fusepy; loads libfuse.so.2)
    except (ImportError, OSError) as e:
        return f"fusepy or libfuse2 is missing ({e}); scripts/setup.sh installs both"
    return None


@contextlib.contextmanager
def mounted_stuck(source: Path, tmp_path: Path, suffix: str):
    """`source` mirrored through stuck_fs.py: (mountpoint, flag); reads of files ending in
    `suffix` block while the flag file exists."""
    why = _fuse_unavailable()
    if why:
        pytest.skip(why)
    mountpoint, flag = tmp_path / "mnt", tmp_path / "stuck"
    mountpoint.mkdir()
    fs = subprocess.Popen([sys.executable, str(STUCK_FS), str(source), str(mountpoint),
                           str(flag), suffix], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    deadline = time.monotonic() + 15
    first = next(source.iterdir()).name
    while not (mountpoint / first).exists():
        if fs.poll() is not None or time.monotonic() > deadline:
            fs.kill()
            pytest.skip(f"the FUSE file system did not mount: {fs.communicate()[1][-500:]}")
        time.sleep(0.05)
    try:
        yield mountpoint, flag
    finally:
        flag.unlink(missing_ok=True)
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)
        fs.terminate()
        try:
            fs.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fs.kill()
            fs.wait()


@pytest.fixture()
def stuck_mount(image_dataset, tmp_path):
    """image_dataset mirrored through stuck_fs.py: (mountpoint, flag); reads of .zws files block
    while the flag file exists."""
    with mounted_stuck(image_dataset, tmp_path, ".zws") as mounted:
        yield mounted


# Runs in a child process, so that a hang fails the test (subprocess timeout) instead of pytest.
CHILD = textwrap.dedent("""
    import json, pathlib, sys, time
    import zerowait

    mountpoint, flag, io = sys.argv[1], sys.argv[2], sys.argv[3]
    loader = zerowait.Loader(mountpoint, batch_size=4, shuffle=False, threads=1, prefetch=1,
                             read_timeout=1.0, autotune=False, io=io)
    assert loader.next(timeout=30) is not None
    pathlib.Path(flag).touch()  # from now on every read of a shard blocks
    start = time.monotonic()
    error = None
    try:
        while loader.next(timeout=3) is not None:
            pass
    except zerowait.DeadlineExceededError as e:
        error = str(e)
    waited = time.monotonic() - start
    start = time.monotonic()
    loader.close()
    print(json.dumps({"error": error, "waited": waited, "closed_in": time.monotonic() - start}),
          flush=True)
""")


@pytest.mark.parametrize("io", ["pread", "io_uring"])
def test_a_stuck_file_system_is_named_and_the_process_still_exits(stuck_mount, io):
    mountpoint, flag = stuck_mount
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(mountpoint), str(flag), io],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The child reports before it exits. A thread blocked in a FUSE read the file system has
    # already received cannot be killed, not even by SIGKILL, until the read is answered (as on
    # a hard NFS mount): so the flag goes away first, then the child must end.
    line = ""
    ready = select.select([child.stdout], [], [], 120)[0]
    if ready:
        line = child.stdout.readline()
    reported_after = time.monotonic() - started
    flag.unlink(missing_ok=True)
    try:
        _, stderr = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        _, stderr = child.communicate()
        pytest.fail(f"the process did not end after the mount came back: {stderr[-2000:]}")
    assert line, f"no report within 120 s: next() or close() hung on the stuck mount: {stderr[-3000:]}"
    assert child.returncode == 0, stderr[-3000:]
    outcome = json.loads(line)
    error = outcome["error"]
    assert error is not None, "every batch arrived although the shards' reads were stuck"
    assert f"is blocked reading '{mountpoint}/" in error, error
    assert ".zws' at offset" in error, error
    # The run was left to the blocked worker, and said so once on stderr.
    assert "blocked in reads that ignore their deadline" in stderr, stderr[-2000:]
    print(f"io={io}: next() raised after {outcome['waited']:.1f} s, close() took "
          f"{outcome['closed_in']:.1f} s, reported after {reported_after:.1f} s")


def test_the_doctor_abandons_a_stalled_read_at_its_time_bound(tmp_path, cli):
    """`zerowait doctor` on a tree of small files whose every read hangs: the small-file probe's
    read is abandoned at its time bound and named in the evidence, and the whole run keeps the
    documented "well under 2 seconds" (asserted with 1 s of margin)."""
    tree = tmp_path / "tree"
    for d in range(6):
        (tree / f"d{d}").mkdir(parents=True)
        for i in range(200):
            (tree / f"d{d}" / f"{i}.bin").write_bytes(os.urandom(2048))
    with mounted_stuck(tree, tmp_path, ".bin") as (mountpoint, flag):
        flag.touch()  # from now on every read of a file blocks
        started = time.monotonic()
        doctor = subprocess.Popen([str(cli), "doctor", str(mountpoint), "--json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = doctor.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # Its read cannot be killed until answered: the mount answers first.
            flag.unlink()
            doctor.kill()
            doctor.communicate()
            pytest.fail("the doctor waited for a read the mount never answers")
        took = time.monotonic() - started
    assert doctor.returncode in (0, 3), stderr
    report = json.loads(stdout)
    (small_files,) = [f for f in report["findings"] if f["check"] == "storage.small_files"]
    assert f"a read of {mountpoint}/d" in small_files["evidence"], small_files
    assert "was abandoned" in small_files["evidence"], small_files
    assert report["seconds"] <= 2 + 1, report["seconds"]
    assert took <= 2 + 1 + 2, f"{took:.2f} s from start to exit (the report says " \
        f"{report['seconds']:.2f} s; 2 s of that margin for starting the process)"
    print(f"doctor on a stuck mount: {report['seconds']:.2f} s in the report, {took:.2f} s "
          f"to exit; {small_files['summary']}")
