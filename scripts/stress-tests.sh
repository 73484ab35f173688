#!/usr/bin/env bash
# Runs the timing-sensitive tests (tests/timing_sensitive.txt) many times under a CPU load, to
# find the ones that pass only on a quiet machine.
#
#   bash scripts/stress-tests.sh                 # each listed test 20 times, one CPU hog a core
#   bash scripts/stress-tests.sh --runs 5 --only block_cache   # the entries whose line matches
#   bash scripts/stress-tests.sh --suite 2       # and then the whole suite (ctest, pytest) twice
#
# Options: --runs K (default 20), --hogs N (busy loops started first; default: one a core, so the
# load is about twice the cores), --list FILE, --only REGEX (entries whose line matches),
# --suite N (whole-suite rounds after the listed tests; default 0), --out DIR (default
# build/stress), --build DIR (the CMake build whose tests run; default build/, or build-san/ for
# the sanitizer build the suite runs). Needs that build's test programs built, the package
# installed into .venv, and pytest-repeat (scripts/setup.sh --tests installs it).
#
# Prints a table: entry, runs, failures, 1-minute load average when it ended, seconds. The output
# of every failed run is kept under DIR. The exit status is 1 if anything failed or an entry
# matched no test.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

RUNS=20
HOGS="$(nproc)"
LIST="tests/timing_sensitive.txt"
ONLY=""
SUITE=0
OUT="build/stress"
BUILD="build"
while (($#)); do
  case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --hogs) HOGS="$2"; shift 2 ;;
    --list) LIST="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --suite) SUITE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "stress-tests.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done

VPY="$ROOT/.venv/bin/python"
[[ -f "$LIST" ]] || { echo "stress-tests.sh: no list at $LIST" >&2; exit 2; }
[[ -f "$BUILD/CTestTestfile.cmake" ]] || {
  echo "stress-tests.sh: no CMake build with tests in $BUILD; see docs/testing.md" >&2; exit 2; }
BUILD="$(cd "$BUILD" && pwd)"
if grep -q '^pytest ' "$LIST" && ! "$VPY" -c 'import pytest_repeat' 2>/dev/null; then
  echo "stress-tests.sh: pytest-repeat is missing: $VPY -m pip install pytest-repeat" >&2
  exit 2
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

HOG_PIDS=()
S3_STARTED=0
cleanup() {
  for pid in "${HOG_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  if ((S3_STARTED)); then
    ctest --test-dir "$BUILD" -R '^S3Server\.Stop$' >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
for ((i = 0; i < HOGS; i++)); do
  (while :; do :; done) &
  HOG_PIDS+=($!)
done
echo "stress-tests.sh: $HOGS CPU hogs on $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"

load1() { cut -d' ' -f1 /proc/loadavg; }
ROWS=()
FAILED=0
# Appends a row: entry, runs, failures, load, seconds.
row() {
  ROWS+=("$(printf '| %s | %s | %s | %s | %s |' "$@")")
  echo "  ${ROWS[-1]}"
}
# The number before WORD in pytest's summary line ("3 failed, 17 passed in 9.1s"), or 0.
count() { sed -n "s/.*\b\([0-9][0-9]*\) $1.*/\1/p" <<<"$2" | grep . || echo 0; }
slug() { tr -c 'A-Za-z0-9_.-' '_' <<<"$1" | cut -c1-100; }

# A CTest regex, run K times, one ctest call each (a process per test, as the suite runs them).
# The S3 server fixture is started once for all of them, not by every call.
run_ctest() {
  local regex="$1" started=$SECONDS runs=0 failures=0 n log
  n="$(ctest --test-dir "$BUILD" -N -R "$regex" -FA s3_server | sed -n 's/^Total Tests: //p')"
  if [[ -z "$n" || "$n" == 0 ]]; then
    echo "  no test matches '$regex': build its test program (docs/testing.md)" >&2
    row "ctest $regex" 0 "no test" "$(load1)" 0
    FAILED=1
    return
  fi
  if ((!S3_STARTED)) && ctest --test-dir "$BUILD" -N -R "$regex" --show-only=json-v1 |
      grep -q 'ZEROWAIT_TEST_S3_DIR'; then
    echo "  starting the S3 server (tests/s3/rgw.sh)"
    ctest --test-dir "$BUILD" -R '^S3Server\.Start$' --output-on-failure >"$OUT/s3-start.log" 2>&1 ||
      { echo "  the S3 server did not start: $OUT/s3-start.log" >&2; exit 1; }
    S3_STARTED=1
  fi
  for ((r = 1; r <= RUNS; r++)); do
    log="$OUT/$(slug "$regex")-run$r.log"
    if ctest --test-dir "$BUILD" -R "$regex" -FA s3_server --output-on-failure >"$log" 2>&1; then
      rm -f "$log"
    else
      local failed_here
      failed_here="$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed.*/\1/p' "$log")"
      failures=$((failures + ${failed_here:-1}))
      echo "  run $r: $(grep -E '^ +[0-9]+ - ' "$log" | sed 's/^ *//' | tr '\n' ' ')-> $log"
    fi
    runs=$((runs + n))
  done
  ((failures == 0)) || FAILED=1
  row "ctest $regex" "$runs" "$failures" "$(load1)" "$((SECONDS - started))"
}

# A pytest node id or file, K times in one pytest call (pytest-repeat's --count).
run_pytest() {
  local node="$1" started=$SECONDS log rc=0 summary passed failed errors
  log="$OUT/$(slug "$node").log"
  "$VPY" -m pytest -p no:cacheprovider -q -rfE --count "$RUNS" "$node" >"$log" 2>&1 || rc=$?
  summary="$(tail -n 1 "$log")"
  passed="$(count passed "$summary")"
  failed=$(($(count failed "$summary") + $(count error "$summary")))
  if ((rc != 0 && failed == 0)); then failed=1; fi  # collection errors, crashes, nothing run
  if ((failed)); then
    FAILED=1
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/  /' || true
    echo "  -> $log"
  else
    rm -f "$log"
  fi
  row "pytest $node" "$((passed + failed))" "$failed" "$(load1)" "$((SECONDS - started))"
}

while read -r kind what _; do
  [[ -z "$kind" || "$kind" == \#* ]] && continue
  line="$kind $what"
  [[ -n "$ONLY" && ! "$line" =~ $ONLY ]] && continue
  echo "$line"
  case "$kind" in
    ctest) run_ctest "$what" ;;
    pytest) run_pytest "$what" ;;
    *) echo "stress-tests.sh: $LIST: unknown kind '$kind'" >&2; exit 2 ;;
  esac
done <"$LIST"

for ((s = 1; s <= SUITE; s++)); do
  echo "whole suite, round $s"
  started=$SECONDS
  if ctest --test-dir "$BUILD" -j "$(nproc)" --output-on-failure >"$OUT/suite-ctest-$s.log" 2>&1; then
    row "ctest (all), round $s" all 0 "$(load1)" "$((SECONDS - started))"
  else
    FAILED=1
    row "ctest (all), round $s" all "see suite-ctest-$s.log" "$(load1)" "$((SECONDS - started))"
  fi
  started=$SECONDS
  if "$VPY" -m pytest -p no:cacheprovider -q -rfE tests/python >"$OUT/suite-pytest-$s.log" 2>&1; then
    row "pytest tests/python, round $s" all 0 "$(load1)" "$((SECONDS - started))"
  else
    FAILED=1
    row "pytest tests/python, round $s" all "see suite-pytest-$s.log" "$(load1)" \
      "$((SECONDS - started))"
  fi
done

echo
echo "| entry | runs | failures | load (1 min) | s |"
echo "|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
echo "failed runs' output: $OUT"
exit "$FAILED"
