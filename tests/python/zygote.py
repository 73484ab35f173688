"""A process that has imported torch once and forks the tests' Python workers from there.

`python SCRIPT` costs the tests about 2.5 s of CPU in `import torch` alone, and the multi-rank
tests start a hundred and more such processes: on CI's two cores that was a sixth of the Python
suite's time. helpers.ZygoteProcess asks this server for a child instead: the child is forked
with torch already imported, takes the environment, working directory, arguments and standard
streams it was given, and runs SCRIPT as `__main__` the way `python SCRIPT` would (uncaught
exceptions, sys.exit and interpreter shutdown included). What differs from a new interpreter is
only what was fixed at import: torch (and numpy) were imported with the server's environment.

Protocol, one connection a child, on the unix socket named by argv[1]: the client sends one JSON
line {"argv": [...], "env": {...}, "cwd": "..."} with its stdout and stderr pipe ends attached
(SCM_RIGHTS); the server answers "PID\\n" and, when the child has ended, "STATUS\\n" (Popen's
returncode: the exit code, or minus the signal that ended it). The server prints "ready" once
listening and exits when its stdin closes (the test process that started it ended).
"""

from __future__ import annotations

import array
import gc
import json
import os
import runpy
import select
import socket
import sys

import numpy  # noqa: F401  (imported once here, inherited by every child)
import torch  # noqa: F401


def _receive(conn: socket.socket):
    """One request line and the two file descriptors sent with it."""
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        chunk, ancdata, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(2 * fds.itemsize))
        if not chunk:
            raise EOFError("the client closed the connection before its request was whole")
        data += chunk
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def serve(path: str):
    """Forks a child for each request until stdin closes. Returns, in a child only, the request
    that child is to run (every descriptor of the server closed but its streams)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    children = {}  # pid -> the connection that hears its status
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 0.05)
        if sys.stdin in readable and not sys.stdin.buffer.read1(1):
            for conn in children.values():
                conn.close()
            return None
        if listener in readable:
            conn, _ = listener.accept()
            try:
                request, (out, err) = _receive(conn)
            except (OSError, EOFError, ValueError) as e:  # that client's loss, not the others'
                print(f"zygote: a request could not be read: {e}", file=sys.stderr, flush=True)
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            # What the server holds (torch's and numpy's objects above all) goes into the
            # collector's permanent generation, as gc.freeze's documentation advises before a
            # fork: the child's collections, its final one at exit included, never walk those
            # objects again, nor copy their pages by touching them (a child that uses torch and
            # exits: 0.51 s -> 0.31 s).
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for other in children.values():
                    other.close()
                devnull = os.open(os.devnull, os.O_RDONLY)
                for fd, target in ((devnull, 0), (out, 1), (err, 2)):
                    os.dup2(fd, target)
                    os.close(fd)
                return request
            os.close(out)
            os.close(err)
            conn.sendall(f"{pid}\n".encode())
            children[pid] = conn
        while children:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
                except OSError:
                    pass  # the client went away first
                conn.close()


def run_as_main(request) -> None:
    """Becomes `python ARGV...` in `cwd` with `env`: runs the script as __main__; its exit is the
    interpreter's (SystemExit, an uncaught exception's traceback and status 1, atexit)."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    sys.stdin = open(0, closefd=False)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    child_request = serve(sys.argv[1])
    if child_request is not None:
        run_as_main(child_request)
