#!/usr/bin/env bash
# Builds zerowait and runs every test suite: the one command CI runs.
#
#   bash scripts/test.sh          # the package + pytest; C++ tests and fuzzers under ASan+UBSan
#   bash scripts/test.sh --quick  # one plain build: ctest, the package from it, pytest
#
# Two C++ builds serve CI: build/cp*/ (gcc, Release) is the wheel's (scripts/build-wheel.sh), which
# the Python tests install into .venv; build-san/ (clang, ASan+UBSan, libFuzzer's coverage) runs
# every C++ test and every fuzzer once, sanitized: a plain run would catch nothing more. build-san/
# is built beside pytest at idle priority (its output: build/san-build.log). --quick
# skips build-san/ and runs the C++ tests in a plain build/ instead.
#
# Runs scripts/setup.sh --tests --no-demo first when .venv is missing, older than that script or
# set up without the tests' requirements. Every
# step runs even when an earlier one failed; the exit status is non-zero if any step failed. The
# end prints each step's time and the ten slowest tests of each suite.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

QUICK=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    -h | --help)
      sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "test.sh: unknown option '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

JOBS="$(nproc)"
# Test processes at a time: a C++ test waits on its children, servers and deadlines about half
# its time (ctest -j 2: 128 s, -j 4: 77 s, ASan+UBSan, 2 cores), a Python test about a fifth
# (pytest -n 2 left 18 % of the CPU idle); so more of them than cores.
CTEST_JOBS=$((JOBS * 2))
PYTEST_WORKERS=$((JOBS + 1))
FUZZ_SECONDS="${ZEROWAIT_FUZZ_SECONDS:-30}"
VPY="$ROOT/.venv/bin/python"
START=$SECONDS
RESULTS=()
FAILED=0
SLOWEST="$ROOT/build/slowest-tests.txt"  # appended to by each suite, printed at the end

step() { printf '\n==> %s\n' "$*"; }

# Runs `$2...` as step `$1` in a subshell with errexit on, records pass/fail and time, and goes on.
run_step() {
  local name="$1" started=$SECONDS rc
  shift
  step "$name"
  set +e
  (
    set -euo pipefail
    "$@"
  )
  rc=$?
  set -e
  if ((rc == 0)); then
    RESULTS+=("$name: ok ($((SECONDS - started)) s)")
  else
    RESULTS+=("$name: FAILED (exit $rc, $((SECONDS - started)) s)")
    FAILED=$((FAILED + 1))
    echo "test.sh: step '$name' failed with exit status $rc" >&2
  fi
}

# --- steps -------------------------------------------------------------------------------------
ensure_setup() {
  local want have
  want="$(sha256sum scripts/setup.sh | cut -d' ' -f1) tests"
  have="$(cat .venv/.zerowait-setup 2>/dev/null || true)"
  if [[ -x "$VPY" ]] && "$VPY" -c 'import sys' 2>/dev/null && [[ "$want" == "$have" ]]; then
    echo ".venv is set up for the tests"
  else
    echo ".venv is missing, older than scripts/setup.sh or without the tests' requirements:" \
      "running scripts/setup.sh --tests --no-demo"
    bash scripts/setup.sh --tests --no-demo
  fi
}

# cmake_build DIR [cmake args...]: configure (Ninja) and build.
cmake_build() {
  local dir="$1"
  shift
  cmake -S . -B "$dir" -G Ninja "$@"
  cmake --build "$dir" -j "$JOBS"
}

# slowest_of JUNIT_XML LABEL: appends that suite's ten slowest tests to $SLOWEST.
slowest_of() {
  [[ -f "$1" ]] || return 0
  "$VPY" - "$1" "$2" >>"$SLOWEST" <<'EOF'
import sys, xml.etree.ElementTree as ET
cases = [(float(c.get("time") or 0), ".".join(dict.fromkeys(
    filter(None, (c.get("classname"), c.get("name"))))))
         for c in ET.parse(sys.argv[1]).iter("testcase")]
for seconds, name in sorted(cases, reverse=True)[:10]:
    print(f"  {seconds:7.2f} s  {sys.argv[2]}  {name}")
EOF
}

plain_cpp_tests() {
  cmake_build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
  local rc=0
  ctest --test-dir build --output-on-failure -j "$CTEST_JOBS" --output-junit ctest-junit.xml ||
    rc=$?
  slowest_of build/ctest-junit.xml ctest
  return $rc
}

# The sanitized build's configuration. A unity build: CI builds it once from scratch, 30 % faster
# than file by file (README). The library at -O1 and line tables only, as the sanitizers' and
# libFuzzer's docs suggest: reports keep their file:line stacks, and the build takes about a fifth
# less CPU than -O2 -g. The tests and the CLI at -O0 (ZEROWAIT_UNOPTIMIZED_TEST_CODE): on 2 cores
# the build took 293 s instead of 389, ctest 106 s instead of 92.
build_sanitized() {
  CC=clang CXX=clang++ cmake_build build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    -DZEROWAIT_UNOPTIMIZED_TEST_CODE=ON \
    -DZEROWAIT_SANITIZE=ON -DZEROWAIT_FUZZ=ON -DZEROWAIT_BUILD_BENCH=OFF -DZEROWAIT_UNITY_BUILD=ON
}

# The sanitized build takes about 450 s of CPU, and the Python tests leave part of the cores idle
# (tests waiting on their children, servers and deadlines: pytest used 88 % of them). So it
# starts beside them at idle CPU and I/O priority (SCHED_IDLE, ionice's idle class): it runs only
# on cycles nothing else wants, and took nothing measurable from the tests (README); the
# sanitized step then waits for what is left of it. Its output goes to $SAN_BUILD_LOG, its exit
# status to $SAN_BUILD_STATUS.
SAN_BUILD_LOG="$ROOT/build/san-build.log"
SAN_BUILD_STATUS="$ROOT/build/san-build.status"
SAN_BUILD_START=0 SAN_BUILD_PID=""
kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
start_sanitized_build_at_idle_priority() {
  SAN_BUILD_START=$SECONDS
  rm -f "$SAN_BUILD_STATUS"
  (
    # SCHED_IDLE, or nice 19 where that is refused; and the idle I/O class.
    chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 ||
      renice -n 19 -p "$BASHPID" >/dev/null 2>&1 || true
    ionice -c 3 -p "$BASHPID" >/dev/null 2>&1 || true
    rc=0
    (set -euo pipefail; build_sanitized) >"$SAN_BUILD_LOG" 2>&1 </dev/null || rc=$?
    echo "$rc" >"$SAN_BUILD_STATUS"
  ) &
  SAN_BUILD_PID=$!
  # Not left running when this script ends early (interrupted, killed by a time limit).
  trap '[[ -s "$SAN_BUILD_STATUS" ]] || kill_tree "$SAN_BUILD_PID"' EXIT
  echo "the sanitized build (build-san/) runs beside the next steps at idle priority;" \
    "its output: $SAN_BUILD_LOG"
}

sanitized_cpp_tests_and_fuzzers() {
  local waited=$SECONDS
  while [[ ! -s "$SAN_BUILD_STATUS" ]]; do sleep 1; done
  echo "the sanitized build beside the other steps ended with status $(cat "$SAN_BUILD_STATUS")" \
    "after $((SECONDS - SAN_BUILD_START)) s, $((SECONDS - waited)) s of them waited for here"
  # Nothing left to do after the build beside the other steps; the whole build where it failed
  # (its errors are shown here).
  build_sanitized
  local rc=0
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    ctest --test-dir build-san --output-on-failure -j "$CTEST_JOBS" \
    --output-junit ctest-junit.xml || rc=$?
  slowest_of build-san/ctest-junit.xml "ctest (ASan+UBSan)"
  # After ctest, not beside it at idle priority: starved there, an input that takes 2 s alone
  # ran past libFuzzer's 10 s timeout (a wall-clock alarm) and failed the step.
  run_fuzzers || rc=$?
  return $rc
}

run_fuzzers() {
  local fuzzers=() fuzzer failed=0
  mapfile -t fuzzers < <(find build-san -type f -perm -u+x -name 'fuzz_*' | sort)
  ((${#fuzzers[@]} > 0)) || {
    echo "no fuzz_* binaries were built in build-san/" >&2
    return 1
  }
  # All at once, sharing the cores for FUZZ_SECONDS: CI's time for them stays FUZZ_SECONDS,
  # however many fuzzers there are (five on 2 cores: about 12 s of a core each).
  echo "fuzzers: ${#fuzzers[@]}, all at once for ${FUZZ_SECONDS} s on $JOBS cores"
  # Real shards and tars as seeds, written by this build's CLI (tests/fuzz/make_seeds.sh).
  rm -rf build-san/seeds
  tests/fuzz/make_seeds.sh build-san/zerowait build-san/seeds
  local pids=() pid
  for fuzzer in "${fuzzers[@]}"; do
    run_fuzzer "$fuzzer" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
  done
  return $failed
}

# run_fuzzer BINARY: FUZZ_SECONDS of it on its corpus and seeds; the crash input kept if any.
run_fuzzer() {
  local fuzzer="$1" name corpus seeds log
  name="$(basename "$fuzzer")"
  corpus="build-san/corpus/$name"
  seeds="build-san/seeds/$name"
  log="build-san/$name.log"
  mkdir -p "$corpus" "$seeds"
  # New inputs go into the first corpus directory; the seeds are read too. -max_len leaves room
  # for a seed shard or tar (a few KB) to grow: libFuzzer's default would be the largest seed.
  if ! "$fuzzer" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -artifact_prefix="build-san/$name-" "$corpus" "$seeds" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "$name found a crash; the input is saved as build-san/$name-* (log: $log)" >&2
    return 1
  fi
  # fuzz_shard also says how many inputs got past the checksums into ShardIndex::parse.
  echo "$name: $(grep -E '^Done [0-9]+ runs' "$log" || tail -n 1 "$log")" \
    "$(grep -E '^fuzz_shard: ' "$log" || true)"
}

python_tests() {
  # The wheel users install (built incrementally in build/cp*/, the directory setup.sh's `pip
  # install .` uses) goes into .venv for the tests, and test_wheel.py installs it as a new user.
  bash scripts/build-wheel.sh --python "$VPY" --no-show
  local wheel
  wheel="$(ls -t dist/zerowait-*-manylinux_*.whl | head -n 1)"
  "$VPY" -m pip install --quiet --force-reinstall --no-deps "$wheel"
  # The tests against the one S3 server share a worker (conftest.py groups them).
  local rc=0
  ZEROWAIT_WHEEL="$ROOT/$wheel" "$VPY" -m pytest tests/python -q -n "$PYTEST_WORKERS" \
    --dist loadgroup --junitxml=build/pytest-junit.xml || rc=$?
  slowest_of build/pytest-junit.xml pytest
  return $rc
}

# --- run ---------------------------------------------------------------------------------------
mkdir -p build
run_step "setup" ensure_setup
# After setup, which installs the compilers on a new machine. (Started before it, where they were
# there already, the build got about 3 of its 57 units done during setup's 300 s: setup leaves
# little idle.)
if ((!QUICK)); then
  start_sanitized_build_at_idle_priority
fi
: >"$SLOWEST"
if ((QUICK)); then
  run_step "C++ tests (build/)" plain_cpp_tests
  run_step "Python tests (pytest)" python_tests
  RESULTS+=("ASan+UBSan and fuzzers: skipped (--quick)")
else
  run_step "Python tests (pytest)" python_tests
  run_step "C++ tests under ASan+UBSan, fuzzers for ${FUZZ_SECONDS} s (build-san/)" \
    sanitized_cpp_tests_and_fuzzers
fi

step "summary"
printf '  %s\n' "${RESULTS[@]}"
if [[ -s "$SLOWEST" ]]; then
  echo "slowest tests:"
  cat "$SLOWEST"
fi
if ((FAILED > 0)); then
  echo "test.sh: FAILED: $FAILED step(s) failed, $((SECONDS - START)) s in all"
  exit 1
fi
echo "test.sh: all steps passed in $((SECONDS - START)) s"
