#!/usr/bin/env bash
# Runs the tests that plant a known cause in a real process and check a diagnostic figure
# against it (watch, the StepProfiler, emulate, bench files, bench storage, the doctor), and
# prints one table: figure, planted truth, measured, tolerance, within it or not.
#
#   bash scripts/ground-truth.sh                 # about 2 minutes on 2 cores
#   bash scripts/ground-truth.sh --build build-san --out /tmp/truth
#
# Options: --build DIR (the CMake build whose C++ tests run; default build-san/, the sanitizer
# build the suite runs), --out DIR (where the records and logs go; default build/ground-truth).
# Needs the package installed into .venv and that build's test programs built (docs/testing.md).
#
# The Python tests record their figures through the `ground_truth` fixture
# (tests/python/conftest.py) into $ZEROWAIT_GROUND_TRUTH. The C++ tests compare exactly (the
# packed side's bytes, the kernel's byte count, the doctor's median), so their rows are their
# pass or fail. The exit status is 1 if a test failed or a figure is outside its tolerance.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="build-san"
OUT="build/ground-truth"
while (($#)); do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ground-truth.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
VPY="$ROOT/.venv/bin/python"
[[ -f "$BUILD/CTestTestfile.cmake" ]] || {
  echo "ground-truth.sh: no CMake build with tests in $BUILD; see docs/testing.md" >&2; exit 2; }
mkdir -p "$OUT"
RECORDS="$OUT/figures.jsonl"
rm -f "$RECORDS"

# Each C++ test: the figure it checks, its planted truth, and its tolerance.
CXX_TESTS=(
  "PackedTree.ComparesEveryFileWithEverySample|bench files: packed side's samples and bytes|60 samples, each file's bytes + 1 label byte|exact"
  "DirectFile.ReadBytesMatchWhatTheKernelCounted|bench storage: bytes read|the kernel's /proc/self/io|depth x bs in flight"
  "DoctorStorage.ATreeOfSmallFilesWarnsWithTheMeasuredGainFromPacking|doctor: small-files median size|1,100 files of 2,000-3,099 B|exact"
  "PageCacheTest.ResidencyFollowsReads|page-cache residency (emulate, bench files)|pages read / evicted|exact"
)
FAILED=0
PY_TESTS=(
  "tests/python/test_watch.py::test_dataloader_job_input_share_matches_the_loop_own"
  "tests/python/test_watch.py::test_pid_of_a_dataloader_job_matches_the_loop_own"
  "tests/python/test_watch.py::test_pid_without_ptrace_rights_is_degraded_and_says_so"
  "tests/python/test_watch.py::test_a_failed_job_is_reported_failed"
  "tests/python/test_profiler.py::test_planted_delays_land_in_their_buckets"
  "tests/python/test_profiler.py::test_wrap_times_a_plain_iterable_as_input"
  "tests/python/test_profiler.py::test_collective_wait_on_a_late_peer"
  "tests/python/test_profiler.py::test_a_slow_map_function_is_named_with_the_change_and_its_effect"
  "tests/python/test_examples.py::test_profiled_training_finds_its_planted_delays"
  "tests/python/test_emulate.py::test_a_run_is_labelled_by_the_page_cache_it_found"
  "tests/python/test_doctor_cli.py::test_the_packing_estimate_is_its_formula_over_the_planted_small_files"
)
echo "ground-truth.sh: ${#PY_TESTS[@]} Python tests, ${#CXX_TESTS[@]} C++ tests" \
  "(load $(cut -d' ' -f1 /proc/loadavg))"
ZEROWAIT_GROUND_TRUTH="$RECORDS" "$VPY" -m pytest -p no:cacheprovider -q -rfEs \
  "${PY_TESTS[@]}" >"$OUT/pytest.log" 2>&1 || FAILED=1
tail -n 1 "$OUT/pytest.log"

CXX_ROWS=()
for entry in "${CXX_TESTS[@]}"; do
  IFS='|' read -r name figure truth tolerance <<<"$entry"
  # --no-tests=error: a test program not built is a failure, not an empty pass.
  if ctest --test-dir "$BUILD" -R "^${name//./\\.}\$" --no-tests=error --output-on-failure \
      >>"$OUT/ctest.log" 2>&1; then
    verdict="yes (test passed)"
  else
    verdict="NO (test failed: $OUT/ctest.log)"
    FAILED=1
  fi
  CXX_ROWS+=("| $figure | $truth | as planted | $tolerance | $verdict |")
done

echo
echo "| figure | planted | measured | tolerance | within |"
echo "|---|---|---|---|---|"
"$VPY" - "$RECORDS" <<'EOF' || FAILED=1
import json, sys
from pathlib import Path

rows = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()] \
    if Path(sys.argv[1]).exists() else []
for row in rows:
    print(f"| {row['figure']} | {row['planted']:.3f} | {row['measured']:.3f} | "
          f"{row['tolerance']} | {'yes' if row['ok'] else 'NO'} |")
sys.exit(0 if rows and all(row["ok"] for row in rows) else 1)
EOF
printf '%s\n' "${CXX_ROWS[@]}"
echo
grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/pytest.log" || true
echo "records: $RECORDS; logs: $OUT"
exit "$FAILED"
