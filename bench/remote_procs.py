"""What bench/remote.py runs besides the loaders: the peers' virtual environments, each row's
process, the S3 server (Ceph RGW) and the latency proxy in front of it.
"""

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import common
import remote_rows
from remote_rows import log

GB = 1e9

# The peers' virtual environments under --out/venvs, made on first use. Pinned: the versions
# measured. MosaicML Streaming pins numpy < 2.2 and imports torchvision, which PyPI builds only
# for a CUDA torch here: hence its own venv with the torch/torchvision pair on this machine's disk.
VENVS = {
    "peers": {"packages": ["torch==2.13.0", "litdata==0.2.76", "webdataset==1.0.2",
                           "s3torchconnector==1.5.0", "boto3==1.44.8"],
              "imports": "litdata, webdataset, s3torchconnector, boto3",
              "size": "about 1.1 GB (torch 2.13.0 CPU, from this machine's disk)"},
    "streaming": {"packages": ["torch==2.14.1", "torchvision==0.29.1",
                               "mosaicml-streaming==0.13.0", "boto3==1.44.8"],
                  "imports": "streaming, boto3",
                  "size": "about 6.3 GB (a CUDA torch 2.14.1 + torchvision 0.29.1, the pair "
                          "PyPI's torchvision imports beside, from this machine's disk)"},
}

# ---- interpreters --------------------------------------------------------------------------------

def python_probe(python, code):
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return result.returncode == 0, (result.stdout + result.stderr).strip()


def ensure_venv(out, name, allow_install):
    """The python of venv `name` under out/venvs, made and filled on first use. Returns (python,
    None) or (None, why not)."""
    venv = out / "venvs" / name
    spec = VENVS[name]
    python = venv / "bin" / "python"
    stamp = venv / "zerowait-bench-packages.json"
    if python.exists() and stamp.is_file() and json.loads(stamp.read_text()) == spec["packages"]:
        ok, message = python_probe(str(python), f"import {spec['imports']}")
        if ok:
            return str(python), None
        log(f"{venv}: import {spec['imports']} fails ({message.splitlines()[-1]}); reinstalling")
    if not allow_install:
        return None, f"no venv at {venv} (--no-install given)"
    log(f"creating {venv} for the {name} rows (first run only): {' '.join(spec['packages'])}; "
        f"{spec['size']}; a few minutes. pip's output: {venv}.install.log")
    start = time.perf_counter()
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{venv}.install.log", "w") as install_log:
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(python), "-m", "pip", "install", *spec["packages"]]]
        for cmd in steps:
            install_log.write(f"$ {' '.join(cmd)}\n")
            install_log.flush()
            code = subprocess.run(cmd, stdout=install_log, stderr=subprocess.STDOUT,
                                  check=False).returncode
            if code != 0:
                tail = Path(f"{venv}.install.log").read_text().strip().splitlines()[-1:]
                return None, (f"installing {name} failed (exit {code}: {' '.join(tail)[:200]}; "
                              f"see {venv}.install.log)")
    ok, message = python_probe(str(python), f"import {spec['imports']}")
    if not ok:
        return None, f"import {spec['imports']} fails in {venv}: {message.splitlines()[-1]}"
    stamp.write_text(json.dumps(spec["packages"]))
    log(f"{venv} ready in {time.perf_counter() - start:.0f} s")
    return str(python), None


# ---- processes -----------------------------------------------------------------------------------

def run_task(python, task, spec, env=None, timeout=None):
    """Runs remote_rows.py TASK SPEC in a session of its own (so its DataLoader workers can be
    ended with it); its stderr is passed through. Returns (result, None) or (None, why)."""
    cmd = [python, str(Path(remote_rows.__file__).resolve()), task, json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    tail = []

    def relay():
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line.rstrip())
            del tail[:-200]

    out = []
    threads = [threading.Thread(target=relay, daemon=True),
               threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return None, f"no result after {timeout} s (ended)"
    except BaseException:
        kill_group(proc)
        raise
    for thread in threads:
        thread.join(5)
    out = "".join(out)
    if proc.returncode != 0:
        how = (f"signal {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"exit code {proc.returncode}")
        return None, f"{how}: {last_error(tail)[:200]}"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        return None, "printed no result"
    return json.loads(lines[-1]), None


def last_error(lines):
    """The last line of `lines` that names an exception (a traceback's last line), else the last
    line that is not blank."""
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b", line.strip()):
            return line.strip()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def kill_group(proc):
    """Ends a process started with start_new_session=True and everything it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class S3Server:
    """tests/s3/rgw.sh on DIR: started on enter, stopped (and DIR removed) on exit, whatever
    happened. `env` holds its AWS_* variables."""

    def __init__(self, folder, memstore_bytes):
        self.dir = folder
        self.memstore_bytes = memstore_bytes
        self.script = common.REPO / "tests" / "s3" / "rgw.sh"
        self.env = {}

    def __enter__(self):
        self.stop()  # a server left by a run that was killed
        log(f"starting the S3 server (Ceph RGW, {self.memstore_bytes / GB:.1f} GB of memstore) "
            f"in {self.dir}")
        env = dict(os.environ, RGW_MEMSTORE_BYTES=str(self.memstore_bytes))
        result = subprocess.run(["bash", str(self.script), "start", str(self.dir)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                check=False)
        if result.returncode != 0:
            self.stop()
            sys.exit(f"bench: {self.script} start failed:\n{result.stderr.strip()}")
        for line in (self.dir / "env").read_text().splitlines():
            key, _, value = line.partition("=")
            self.env[key] = value
        return self

    def stop(self):
        subprocess.run(["bash", str(self.script), "stop", str(self.dir)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    def __exit__(self, *exc):
        log("stopping the S3 server")
        self.stop()

    def curl(self, endpoint, path, output, *extra):
        """A curl command for a request signed with curl's own SigV4 (the parent runs on the
        standard library alone); its body goes to `output` ("-": stdout)."""
        env = self.env
        return ["curl", "-sS", "-o", output, "--aws-sigv4", f"aws:amz:{env['AWS_REGION']}:s3",
                "--user", f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}",
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", *extra, f"{endpoint}/{path}"]

    def create_bucket(self, bucket):
        code = common.run(self.curl(self.env["AWS_ENDPOINT_URL"], bucket, "/dev/null",
                                    "-X", "PUT", "-w", "%{http_code}")).strip()
        if code not in ("200", "409"):
            sys.exit(f"bench: creating bucket {bucket} answered HTTP {code}")


class Proxy:
    """zw_fault_proxy --upstream URL --latency-ms MS: started on enter (its URL read from its
    first line of stdout), ended with SIGTERM on exit."""

    def __init__(self, binary, upstream, latency_ms, log_path):
        # --log-requests: every request with its begin and end times, in log_path at exit.
        self.cmd = [binary, "--upstream", upstream, "--latency-ms", str(latency_ms),
                    "--log-requests"]
        self.log_path = log_path
        self.proc = None
        self.url = None

    def __enter__(self):
        with open(self.log_path, "w") as proxy_log:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=proxy_log,
                                         text=True, start_new_session=True)
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout=15)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith("http://"):
            self.__exit__()
            sys.exit(f"bench: {' '.join(self.cmd)} printed no URL in 15 s (got {line!r}); "
                     f"its stderr is in {self.log_path}")
        self.url = line.rstrip("/")
        return self

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                kill_group(self.proc)


def find_proxy():
    return common.find_binary("ZEROWAIT_FAULT_PROXY", ["build/zw_fault_proxy"],
                              "latency proxy (zw_fault_proxy)")
