"""The wheel as a user installs it: a new unprivileged user, a fresh virtual environment, `pip
install` of the wheel (scripts/build-wheel.sh) and torch from the registry; then the `zerowait`
command packs and verifies a tree, one Loader epoch and a checkpoint round trip run in Python,
and `zerowait doctor` runs. The libraries zerowait links are shown loaded from the wheel's
zerowait.libs (/proc/self/maps of the Python process, ldd of the command), and nothing is left
behind outside the user's home and working directory.

The wheel: $ZEROWAIT_WHEEL (scripts/test.sh builds it and names it there), else the one in dist/.
Needs root, to make the user (CI runs as root)."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

import zerowait

REPO = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the CPU build, which pip takes from this machine's disk
# Libraries that only zerowait brings into these processes (Python, numpy and torch load none of
# them), so any copy outside zerowait.libs would be a system library used instead of the wheel's.
ZEROWAIT_ONLY = ("libcurl", "liburing", "libturbojpeg", "libjpeg", "libpng16", "libwebp",
                 "libsndfile", "libxxhash", "libnghttp2", "libFLAC", "libvorbis")


def stem(library: Path) -> str:
    """libcurl-02fbea31.so.4.8.0 (a copy auditwheel renamed) and libcurl.so.4 -> libcurl."""
    name = library.name.split(".so")[0]
    return re.sub(r"-[0-9a-f]{8}$", "", name)


def find_wheel() -> Path:
    named = os.environ.get("ZEROWAIT_WHEEL")
    if named:
        if not Path(named).is_file():
            pytest.fail(f"ZEROWAIT_WHEEL={named} is not a file; build it: "
                        "bash scripts/build-wheel.sh")
        return Path(named)
    wheels = sorted((REPO / "dist").glob(f"zerowait-{zerowait.__version__}-*manylinux*.whl"),
                    key=lambda p: p.stat().st_mtime)
    if not wheels:
        pytest.skip("no wheel in dist/: bash scripts/build-wheel.sh builds it (scripts/test.sh "
                    "does, and names it in $ZEROWAIT_WHEEL)")
    return wheels[-1]


def pip_settings() -> dict[str, str]:
    """This machine's pip settings (its configuration files and PIP_* variables) as PIP_*
    variables: the user's pip reaches the same registry and the same wheels on disk, although
    root's own configuration file is not readable to it."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                            text=True, timeout=60, check=True).stdout
    settings = {}
    for line in listed.splitlines():
        match = re.fullmatch(r"[^.]*\.([a-z-]+)='(.*)'", line.strip())
        if match:
            settings["PIP_" + match.group(1).upper().replace("-", "_")] = match.group(2)
    return settings


class User:
    """A new unprivileged user (its own uid and group, no other groups) whose home and working
    directory lie under `root`; `run` runs a command as it, in the working directory."""

    def __init__(self, root: Path) -> None:
        self.name = "zw-wheel-" + uuid.uuid4().hex[:8]
        self.home = root / "home"
        self.work = root / "work"
        subprocess.run(["useradd", "--create-home", "--home-dir", self.home, "--user-group",
                        "--shell", "/bin/sh", self.name], check=True, timeout=60,
                       capture_output=True)
        entry = pwd.getpwnam(self.name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        self.work.mkdir()
        os.chown(self.work, self.uid, self.gid)
        self.env = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
                    "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **pip_settings()}
        self.env.update({k: v for k, v in os.environ.items()
                         if k.lower() in ("http_proxy", "https_proxy", "no_proxy")})

    def run(self, *cmd, timeout: float = 300, codes=(0,)) -> subprocess.CompletedProcess:
        args = [str(c) for c in cmd]
        result = subprocess.run(
            ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--",
             *args], env=self.env, cwd=self.work, capture_output=True, text=True,
            timeout=timeout, stdin=subprocess.DEVNULL)
        assert result.returncode in codes, (
            f"`{' '.join(args)}` as {self.name} exited {result.returncode}:\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
        return result

    def remove(self) -> None:
        subprocess.run(["userdel", self.name], timeout=60, capture_output=True)


def files_left_by(uid: int, allowed: Path) -> list[str]:
    """Files owned by `uid` in the places any user may write (the world-writable directories
    near the root of / and /dev/shm), outside `allowed`."""
    found = subprocess.run(["find", "/", "-xdev", "-maxdepth", "3", "-type", "d", "-perm",
                            "-0002"], capture_output=True, text=True, timeout=120).stdout.split()
    places = sorted(set(found) | {"/dev/shm"})
    places = [p for p in places if not any(p.startswith(q + "/") for q in places)]
    left = []
    for place in places:
        left += subprocess.run(["find", place, "-xdev", "-path", str(allowed), "-prune", "-o",
                                "-uid", str(uid), "-print"], capture_output=True, text=True,
                               timeout=120).stdout.split()
    return left


def user_python(user: User, wheel: Path) -> str:
    """An interpreter of the wheel's Python version that the user may run and make a venv with
    (not one under /root, as this process's may be)."""
    tag = re.search(r"-cp(\d)(\d+)-", wheel.name)
    version = f"{tag.group(1)}.{tag.group(2)}"
    for candidate in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if os.access(candidate, os.X_OK) and user.run(
                candidate, "-c", "import venv, ensurepip", codes=(0, 1)).returncode == 0:
            return candidate
    pytest.skip(f"no Python {version} with venv that an unprivileged user can run "
                f"(Debian: apt-get install python{version}-venv)")


@pytest.fixture()
def user():
    if os.geteuid() != 0:
        pytest.skip("making an unprivileged user needs root (CI runs as root)")
    root = Path(tempfile.mkdtemp(prefix="zw-wheel-"))
    root.chmod(0o755)  # the user reaches its home and working directory through it
    made = User(root)
    try:
        yield made
    finally:
        made.remove()
        subprocess.run(["rm", "-rf", root], timeout=300)


def test_the_wheel_installs_and_runs_as_an_unprivileged_user(user):
    wheel = find_wheel()
    python = user_python(user, wheel)
    local_wheel = user.work / wheel.name
    local_wheel.write_bytes(wheel.read_bytes())
    session = user.work / "wheel_session.py"
    session.write_text((Path(__file__).parent / "wheel_session.py").read_text())

    venv = user.work / "venv"
    user.run(python, "-m", "venv", venv)
    # --no-compile: byte-compiling torch's modules is two thirds of the install's time here, and
    # not what this test is about.
    user.run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-compile",
             local_wheel, TORCH, timeout=900)
    zw = venv / "bin" / "zerowait"
    site = Path(user.run(venv / "bin" / "python", "-c",
                         "import sysconfig; print(sysconfig.get_path('platlib'))").stdout.strip())
    libs = site / "zerowait.libs"
    vendored = sorted(p.name for p in libs.iterdir())

    # The command packs and verifies a tree; `python -m zerowait` is the same command.
    user.run(zw, "generate", "imagefolder", "images", "--files", 60, "--classes", 3,
             "--min-bytes", 2000, "--max-bytes", 6000)
    user.run(zw, "pack", "images", "-o", "shards", "--imagefolder")
    assert "verified 60 samples" in user.run(zw, "verify", "shards").stdout
    assert zerowait.__version__ in user.run(venv / "bin" / "python", "-m", "zerowait",
                                            "--version").stdout

    # A Loader epoch and a checkpoint round trip, and the libraries that process mapped.
    report = json.loads(user.run(venv / "bin" / "python", session, "shards", "ckpt").stdout)
    assert report["seen"] == report["samples"] == 60
    assert report["checkpoint_round_trip"]
    assert Path(report["zerowait_file"]).parent == site / "zerowait"
    mapped = [Path(p) for p in report["mapped"]]
    assert sorted(p.name for p in mapped if p.parent == libs) == vendored
    elsewhere = [str(p) for p in mapped if p.parent != libs and stem(p) in ZEROWAIT_ONLY]
    assert not elsewhere, f"system copies mapped beside the wheel's: {elsewhere}"

    # The command resolves every library it needs to the wheel's copy or to the base system.
    for binary in (site / "zerowait" / "_bin" / "zerowait",
                   next((site / "zerowait").glob("_core*.so"))):
        ldd = user.run("ldd", binary).stdout
        assert "not found" not in ldd, ldd
        resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, re.M))
        for name in vendored:
            if name in resolved:
                assert Path(resolved[name]).resolve() == (libs / name).resolve(), ldd
        assert not [n for n in resolved if stem(Path(n)) in ZEROWAIT_ONLY and n not in vendored]

    # doctor runs as this user (3: a check failed on this machine, which is its answer, too).
    doctor = json.loads(user.run(zw, "doctor", "--json", ".", codes=(0, 3)).stdout)
    assert doctor["schema"] == "zerowait.doctor/1" and doctor["findings"]
    # A subcommand that lives in Python runs in the interpreter the command was launched with.
    assert "holds no data set made by zerowait emulate" in user.run(
        zw, "emulate", "cosmoflow", "--data", "images", codes=(1,)).stderr

    left = files_left_by(user.uid, user.home.parent)
    assert not left, f"written outside the user's home and working directory: {left}"
