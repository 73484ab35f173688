"""The dry run's proof that the device build needs nothing this machine has and that machine
may lack: every header the build read and every library its programs load must come from the
repository, the build, the carried prefix (.gpu/prefix), Python's own headers, or the toolchain
that any machine compiling C++ has (libc, libstdc++, the kernel headers).

    python scripts/gpu/deps_audit.py BUILD_DIR PREFIX

Exit 1, listing each offending file and the Debian package it came from, when something would
be missing on the device: add that package to scripts/build-packages.sh.
"""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

# Debian 12 packages a machine that compiles C++ has anyway (gpu-prepare.sh leaves them behind).
TOOLCHAIN = {"libc6", "libc6-dev", "libstdc++6", "libstdc++-12-dev", "libgcc-s1", "libgcc-12-dev",
             "linux-libc-dev", "gcc-12", "g++-12", "libcrypt-dev", "libcrypt1"}


def owners(paths):
    """{path: Debian package} for the paths dpkg knows (one dpkg -S call for all). With /usr
    merged, dpkg knows a file by the one of /lib/... or /usr/lib/... its package installed."""
    if not paths:
        return {}
    aliases = {}
    for path in paths:
        for alias in (path, path[4:] if path.startswith("/usr/") else "/usr" + path):
            aliases[alias] = path
    result = subprocess.run(["dpkg", "-S", *sorted(aliases)], capture_output=True, text=True)
    found = {}
    for line in result.stdout.splitlines():
        package, _, alias = line.partition(": ")
        if alias.strip() in aliases:
            found[aliases[alias.strip()]] = package.split(":")[0]
    return found


def headers(build):
    """Every header the build read, as absolute paths (a compiler launcher such as ccache with
    CCACHE_BASEDIR makes them relative to the build directory)."""
    deps = subprocess.run(["ninja", "-C", str(build), "-t", "deps"], capture_output=True,
                          text=True, check=True).stdout
    return {os.path.normpath(os.path.join(build, line.strip()))
            for line in deps.splitlines() if line.startswith("    ")}


def loaded_libraries(build):
    programs = [p for p in build.rglob("*") if p.is_file() and (
        p.name == "zerowait" or p.name.startswith("test_gpu_") or
        (p.name.startswith("_core") and p.suffix == ".so"))]
    libraries = set()
    for program in programs:
        out = subprocess.run(["ldd", str(program)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if "=> not found" in line:
                libraries.add(line.split()[0] + " (not found)")
            elif "=>" in line and "/" in line:
                libraries.add(line.split("=>")[1].split("(")[0].strip())
    return programs, libraries


def main():
    build, prefix = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    repo = Path(__file__).resolve().parents[2]
    allowed_roots = [repo, build, prefix, Path(sysconfig.get_paths()["include"]).resolve()]
    try:
        import pybind11
        allowed_roots.append(Path(pybind11.get_include()).resolve())
    except ImportError:
        pass

    def outside(path):
        resolved = Path(path).resolve()
        return not any(resolved.is_relative_to(root) for root in allowed_roots)

    read = {h for h in headers(build) if outside(h)}
    programs, libraries = loaded_libraries(build)
    loaded = {lib for lib in libraries if lib.endswith("(not found)") or outside(lib)}
    packages = owners(read | {lib for lib in loaded if not lib.endswith(")")})
    problems = []
    for path in sorted(read | loaded):
        package = packages.get(path)
        if package in TOOLCHAIN:
            continue
        problems.append(f"  {path}  ({package or 'no Debian package'})")
    print(f"audited {len(headers(build))} headers and {len(libraries)} libraries of "
          f"{len(programs)} programs")
    if problems:
        print("from outside the prefix and the toolchain (missing on a bare machine):")
        print("\n".join(problems))
        sys.exit(1)
    print("every header and library comes from the repository, the carried prefix, Python or "
          "the toolchain")


if __name__ == "__main__":
    main()
