#!/usr/bin/env bash
# The device check: builds zerowait on a bare GPU machine, runs the GPU tests and the GPU
# benchmarks, and writes one JSON result plus logs under $OUT (docs/gpu.md).
#
#   bash scripts/gpu-check.sh            # on the GPU machine, with .gpu/ (gpu-prepare.sh) carried
#   bash scripts/gpu-check.sh --dry-run  # here: the same steps; the GPU tests skip, with reasons
#   --only STEPS    comma-separated subset of: preflight,deps,build,tests,bench (default: all)
#   --bench-scale S small (dry run's default) or full (the device's): sizes of the benchmarks
#
# Writes $OUT/gpu-check.json (each step's status and time, the test counts, every benchmark's
# figures) and $OUT/{preflight,build,tests,bench}.log; OUT defaults to gpu-out/. Builds in
# build-gpu/ against the machine's own python3 (ZW_PYTHON overrides; the dry run uses .venv's)
# and the Debian libraries unpacked from .gpu/debs into build-gpu/prefix. Each step has a time limit,
# so that a hang in one still leaves the others' results: whole script about 8 minutes at most.
# Exit status: 0 when every step ran and passed, 1 otherwise (the JSON says which).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DRY_RUN=0
ONLY="preflight,deps,build,tests,bench"
SCALE=""
while (($#)); do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --only) ONLY="${2:?--only needs a list}"; shift ;;
    --bench-scale) SCALE="${2:?--bench-scale needs small or full}"; shift ;;
    -h | --help)
      sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "gpu-check.sh: unknown option '$1' (try --help)" >&2
      exit 2
      ;;
  esac
  shift
done
[[ -z "$SCALE" ]] && SCALE=$([[ $DRY_RUN == 1 ]] && echo small || echo full)
[[ "$SCALE" == small || "$SCALE" == full ]] || { echo "--bench-scale: small or full" >&2; exit 2; }

OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUILD="$ROOT/build-gpu"
PREFIX="$BUILD/prefix"  # not under .gpu/: what the device call carries must stay small
LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu"
SITE="$BUILD/site"  # python/zerowait with the built _core beside it: what PYTHONPATH points at
RESULTS="$BUILD/results"  # one JSON file per step, merged into gpu-check.json at the end
if [[ -n "${ZW_PYTHON:-}" ]]; then
  PY="$ZW_PYTHON"
elif ((DRY_RUN)); then
  PY="$ROOT/.venv/bin/python"
else
  PY="python3"
fi
START=$SECONDS
mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.json

wanted() { [[ ",$ONLY," == *",$1,"* ]]; }
say() { printf '\n==> [%4d s] %s\n' "$((SECONDS - START))" "$*"; }

# record STEP STATUS SECONDS [JSON-OBJECT]: one step's outcome for gpu-check.json.
record() {
  local detail="${4:-{\}}"
  printf '{"step": "%s", "status": "%s", "seconds": %s, "detail": %s}\n' "$1" "$2" "$3" \
    "$detail" >"$RESULTS/$1.json"
}

# run_step NAME LIMIT_S LOG FUNCTION: runs FUNCTION under a time limit, output to $OUT/LOG.
run_step() {
  local name="$1" limit="$2" log="$OUT/$3" fn="$4" started=$SECONDS rc
  say "$name (limit $limit s, log: $3)"
  # In a child bash (the functions and variables are exported), so that `timeout` stops it and
  # everything it started.
  timeout --kill-after=10 "$limit" bash -c "$fn" >>"$log" 2>&1
  rc=$?
  local status=passed
  ((rc == 124 || rc == 137)) && status="timed out after $limit s"
  ((rc != 0 && rc != 124 && rc != 137)) && status="failed (exit $rc)"
  [[ -f "$RESULTS/$name.json" ]] || record "$name" "$status" "$((SECONDS - started))"
  # A step's own record may carry details; its status and time are this function's.
  "$PY" - "$RESULTS/$name.json" "$status" "$((SECONDS - started))" <<'EOF' 2>/dev/null || true
import json, sys
path, status, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
rec = json.load(open(path))
rec["status"], rec["seconds"] = status, seconds
json.dump(rec, open(path, "w"))
EOF
  echo "    $name: $status in $((SECONDS - started)) s"
  tail -n 5 "$log" | sed 's/^/    | /'
  [[ "$status" == passed ]]
}

# --- steps ---------------------------------------------------------------------------------------

# What the machine is: the facts every later failure is read against.
preflight() {
  set +e
  echo "dry run: $DRY_RUN; bench scale: $SCALE"
  grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release
  echo "glibc: $(getconf GNU_LIBC_VERSION)"
  echo "kernel: $(uname -r)"
  echo "cpus: $(nproc); memory: $(awk '/MemTotal/ {print $2 / 1048576 " GiB"}' /proc/meminfo)"
  g++ --version | head -1
  cmake --version | head -1
  ninja --version
  df -h "$ROOT" /tmp | tail -n +2
  findmnt -n -o FSTYPE,OPTIONS --target "$ROOT"
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv
  "$PY" - <<'EOF'
import importlib, json, os, sys
info = {"python": sys.version.split()[0], "executable": sys.executable}
for name in ("torch", "torchvision", "numpy", "safetensors", "pytest", "pybind11"):
    try:
        info[name] = importlib.import_module(name).__version__
    except Exception as e:  # noqa: BLE001 - reported, not raised
        info[name] = f"missing: {e}"
try:
    import torch
    info["cuda"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = p.name
        info["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
except Exception as e:  # noqa: BLE001
    info["cuda_error"] = str(e)
import subprocess  # the wheels' libcudart and libcufile (GPUDirect Storage)
info["cuda_libraries"] = subprocess.run(
    [sys.executable, os.environ["ROOT"] + "/scripts/gpu/cuda_libraries.py"],
    capture_output=True, text=True).stdout.split()
info["nvidia_fs"] = os.path.exists("/proc/driver/nvidia-fs")
print(json.dumps(info, indent=1))
json.dump(info, open(os.environ["RESULTS"] + "/machine.json", "w"))
EOF
  true
}

# The Debian libraries from .gpu/debs, unpacked into build-gpu/prefix and made relocatable.
deps() {
  set -e
  compgen -G "$ROOT/.gpu/debs/*.deb" >/dev/null ||
    { echo "no .gpu/debs/*.deb: run scripts/gpu-prepare.sh here first and carry .gpu"; exit 1; }
  rm -rf "$PREFIX" "$BUILD/CMakeCache.txt"  # the cache holds pkg-config's paths into the prefix
  mkdir -p "$PREFIX"
  local deb
  for deb in "$ROOT"/.gpu/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$PREFIX"
    else  # a machine without dpkg: a .deb is an ar archive holding data.tar.*
      (cd "$PREFIX" && ar p "$deb" "$(ar t "$deb" | grep '^data\.tar')" | tar -x -J -f -)
    fi
  done
  # Debian 12 still ships some libraries in /lib: one directory, and links made relative.
  if [[ -d "$PREFIX/lib/x86_64-linux-gnu" ]]; then
    cp -a "$PREFIX"/lib/x86_64-linux-gnu/. "$LIBDIR"/
    rm -rf "$PREFIX/lib"
  fi
  local link target
  while IFS= read -r link; do
    target="$(readlink "$link")"
    [[ "$target" == /* ]] && ln -sfn "$(basename "$target")" "$link"
  done < <(find "$PREFIX" -type l)
  sed -i "s#=/usr#=$PREFIX/usr#g; s#-I/usr#-I$PREFIX/usr#g; s#-L/usr#-L$PREFIX/usr#g" \
    "$LIBDIR"/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc 2>/dev/null || true
  # pkgconf runs from the prefix, with its own library.
  mkdir -p "$PREFIX/bin"
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s/usr/bin/pkgconf" "$@"\n' "$LIBDIR" \
    "$PREFIX" >"$PREFIX/bin/pkg-config"
  chmod +x "$PREFIX/bin/pkg-config"
  # A library built against a newer glibc than this machine's would not load: the machine's
  # own copy of it (same soname) serves instead.
  local have need lib
  have="$(getconf GNU_LIBC_VERSION | awk '{print $2}')"
  for lib in "$LIBDIR"/*.so.*; do
    [[ -f "$lib" && ! -L "$lib" ]] || continue
    need="$(objdump -T "$lib" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' |
      sort -uV | tail -1)"
    if [[ -n "$need" && "$(printf '%s\n%s\n' "$need" "$have" | sort -V | tail -1)" != "$have" ]]
    then
      echo "$(basename "$lib") needs glibc $need > $have: the machine's own copy serves"
      rm -f "$lib"
    fi
  done
  echo "unpacked $(ls "$ROOT"/.gpu/debs/*.deb | wc -l) packages into build-gpu/prefix" \
    "($(du -sh "$PREFIX" | cut -f1))"
}

# cmake + ninja against the prefix only (the machine's own -dev packages, if any, are ignored),
# the Python module for the machine's python3, the CLI and the GPU test programs.
build() {
  set -e
  local pybind11_dir python_include=() rpath no_launcher=()
  # The dry run's audit reads the compiler's own dependency lists: no cache may answer for it.
  ((DRY_RUN)) && no_launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_C_COMPILER_LAUNCHER=)
  pybind11_dir="$("$PY" -m pybind11 --cmakedir)"
  if ! "$PY" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(
      os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    echo "this python has no headers: using .gpu/python3.12-include"
    python_include=(-DPython_INCLUDE_DIR="$ROOT/.gpu/python3.12-include")
  fi
  # RPATH, not RUNPATH: it also serves the libraries' own dependencies (libcurl's libssl...), so
  # no LD_LIBRARY_PATH leaks the prefix into other programs (python's own _ssl, torch).
  rpath="-Wl,--disable-new-dtags -Wl,-rpath,$LIBDIR"
  PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig" PKG_CONFIG_PATH="" \
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DZEROWAIT_BUILD_PYTHON=ON -DZEROWAIT_BUILD_TESTS=ON -DZEROWAIT_BUILD_BENCH=OFF \
    -DPython_EXECUTABLE="$(command -v "$PY")" "${python_include[@]}" -Dpybind11_DIR="$pybind11_dir" \
    -DPKG_CONFIG_EXECUTABLE="$PREFIX/bin/pkg-config" \
    -DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF -DCMAKE_PREFIX_PATH="$PREFIX/usr" \
    -DGTest_DIR="$LIBDIR/cmake/GTest" -DCLI11_DIR="$PREFIX/usr/share/cmake/CLI11" \
    -Dnlohmann_json_DIR="$PREFIX/usr/share/cmake/nlohmann_json" \
    -DZLIB_INCLUDE_DIR="$PREFIX/usr/include" -DZLIB_LIBRARY="$LIBDIR/libz.so" \
    -DPNG_PNG_INCLUDE_DIR="$PREFIX/usr/include" -DPNG_LIBRARY="$LIBDIR/libpng16.so" \
    -DOPENSSL_ROOT_DIR="$PREFIX/usr" -DOPENSSL_INCLUDE_DIR="$PREFIX/usr/include" \
    -DOPENSSL_CRYPTO_LIBRARY="$LIBDIR/libcrypto.so" \
    -DOPENSSL_SSL_LIBRARY="$LIBDIR/libssl.so" \
    -DCMAKE_EXE_LINKER_FLAGS="$rpath" -DCMAKE_SHARED_LINKER_FLAGS="$rpath" \
    -DCMAKE_MODULE_LINKER_FLAGS="$rpath" \
    "${no_launcher[@]}"
  # Only what the GPU checks run: the module, the CLI, and the GPU test programs (tests/test_gpu_*).
  local targets=(_core zerowait) t
  for t in $(cd "$ROOT/tests" && ls test_gpu_*.cpp 2>/dev/null | sed "s/\.cpp$//"); do
    targets+=("$t")
  done
  cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"
  rm -rf "$SITE"
  mkdir -p "$SITE"
  cp -r "$ROOT/python/zerowait" "$SITE/"
  cp "$BUILD"/python/_core*.so "$SITE/zerowait/"
  PYTHONPATH="$SITE" "$PY" -c 'import zerowait; print("zerowait", zerowait.__version__,
    "imports from", zerowait.__file__)'
  if ((DRY_RUN)); then
    echo "checking that every header and library came from the prefix or the toolchain"
    "$PY" "$ROOT/scripts/gpu/deps_audit.py" "$BUILD" "$PREFIX"
  fi
}

# Directories holding the CUDA runtime, cuFile and NVML, for the C++ test programs (a Python
# process uses torch's copies): the nvidia-* wheels', torch's, the toolkit's and the driver's.
cuda_library_path() {
  local dirs=() dir lib
  for lib in $("$PY" "$ROOT/scripts/gpu/cuda_libraries.py") \
    /usr/local/cuda/lib64/libcudart.so* /usr/local/nvidia/lib64/libnvidia-ml.so*; do
    [[ -e "$lib" ]] || continue
    dir="$(dirname "$lib")"
    [[ " ${dirs[*]} " == *" $dir "* ]] || dirs+=("$dir")
  done
  local IFS=:
  echo "${dirs[*]}"
}

tests() {
  set +e
  local rc_c rc_py cuda_libs cufile
  cuda_libs="$(cuda_library_path)"
  echo "CUDA libraries for the C++ tests: ${cuda_libs:-none found}"
  # The nvidia-cufile wheel's library for the C++ GPUDirect Storage tests (in Python,
  # zerowait.gds preloads it itself).
  cufile="$(PYTHONPATH="$SITE" "$PY" -c 'from zerowait.gds import wheel_library
print(wheel_library()[0] or "")' 2>/dev/null)"
  echo "libcufile for the C++ tests: ${cufile:-none found (the GDS tests say so)}"
  ZEROWAIT_CUFILE_LIBRARY="${ZEROWAIT_CUFILE_LIBRARY:-$cufile}" \
    LD_LIBRARY_PATH="${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    ctest --test-dir "$BUILD" -L gpu --output-on-failure -j 4 --timeout 300 \
    --output-junit "$BUILD/ctest-junit.xml"
  rc_c=$?
  ZEROWAIT_CLI="$BUILD/zerowait" PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 \
    "$PY" -m pytest "$ROOT/tests/python" -m gpu -rs -v -p no:cacheprovider \
    --junitxml="$BUILD/pytest-junit.xml"
  rc_py=$?
  "$PY" "$ROOT/scripts/gpu/junit_summary.py" "$BUILD/ctest-junit.xml" \
    "$BUILD/pytest-junit.xml" >"$RESULTS/tests.json.detail"
  record tests "" 0 "$(cat "$RESULTS/tests.json.detail")"
  rm -f "$RESULTS/tests.json.detail"
  ((rc_c == 0 && rc_py == 0))
}

bench() {
  set +e
  ZEROWAIT_CLI="$BUILD/zerowait" PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 \
    "$PY" "$ROOT/bench/gpu.py" --scale "$SCALE" --json "$RESULTS/bench.detail" \
    --work "$BUILD/bench-work"
  local rc=$?
  [[ -f "$RESULTS/bench.detail" ]] && record bench "" 0 "$(cat "$RESULTS/bench.detail")"
  rm -f "$RESULTS/bench.detail"
  return $rc
}

# --- run ---------------------------------------------------------------------------------------

export ROOT DRY_RUN SCALE OUT BUILD PREFIX LIBDIR SITE RESULTS PY START
export -f say record preflight deps build cuda_library_path tests bench
FAILED=0
: >"$OUT/preflight.log"
for step in preflight deps build tests bench; do
  wanted "$step" || continue
  # Limits on the 16-core GPU machine: the build 4 min (the bound its lease is planned on), the
  # script 8 in all. A dry run on 2 cores gets ten times as long.
  case "$step" in
    preflight) limit=30 log=preflight.log ;;
    deps) limit=60 log=preflight.log ;;
    build) limit=240 log=build.log ;;
    tests) limit=150 log=tests.log ;;
    bench) limit=210 log=bench.log ;;
  esac
  ((DRY_RUN)) && limit=$((limit * 10))
  [[ "$log" == preflight.log ]] || : >"$OUT/$log"
  if ! run_step "$step" "$limit" "$log" "$step"; then
    FAILED=$((FAILED + 1))
    # Nothing after a failed build can run.
    [[ "$step" == deps || "$step" == build ]] && break
  fi
done

"$PY" - "$RESULTS" "$OUT/gpu-check.json" "$DRY_RUN" "$((SECONDS - START))" <<'EOF'
import json, pathlib, sys
results, out, dry_run, seconds = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
doc = {"dry_run": dry_run == "1", "seconds": float(seconds), "steps": {}}
machine = results / "machine.json"
if machine.exists():
    doc["machine"] = json.loads(machine.read_text())
for step in ("preflight", "deps", "build", "tests", "bench"):
    path = results / f"{step}.json"
    if path.exists():
        rec = json.loads(path.read_text())
        doc["steps"][step] = {k: v for k, v in rec.items() if k != "step"}
json.dump(doc, open(out, "w"), indent=1)
print(json.dumps({k: v["status"] for k, v in doc["steps"].items()}))
EOF
say "done: $FAILED step(s) failed; results in $OUT/gpu-check.json"
((FAILED == 0))
