#!/usr/bin/env bash
# Builds zerowait and runs every test suite: the one command CI runs.
#
#   bash scripts/test.sh          # dev build + ctest, ASan/UBSan build + ctest, fuzzers, pytest
#   bash scripts/test.sh --quick  # dev build + ctest, pytest (skips the sanitizer and fuzz builds)
#
# Runs scripts/setup.sh --no-demo first when .venv is missing or older than that script. Every
# step runs even when an earlier one failed; the exit status is non-zero if any step failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

QUICK=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    -h | --help)
      sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "test.sh: unknown option '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

JOBS="$(nproc)"
FUZZ_SECONDS="${ZEROWAIT_FUZZ_SECONDS:-30}"
VPY="$ROOT/.venv/bin/python"
START=$SECONDS
RESULTS=()
FAILED=0

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
  want="$(sha256sum scripts/setup.sh | cut -d' ' -f1)"
  have="$(cat .venv/.zerowait-setup 2>/dev/null || true)"
  if [[ -x "$VPY" ]] && "$VPY" -c 'import sys' 2>/dev/null && [[ "$want" == "$have" ]]; then
    echo ".venv is set up"
  else
    echo ".venv is missing or older than scripts/setup.sh: running scripts/setup.sh --no-demo"
    bash scripts/setup.sh --no-demo
  fi
}

# cmake_build DIR [cmake args...]: configure (Ninja) and build.
cmake_build() {
  local dir="$1"
  shift
  cmake -S . -B "$dir" -G Ninja "$@"
  cmake --build "$dir" -j "$JOBS"
}

dev_tests() {
  cmake_build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
  ctest --test-dir build --output-on-failure -j "$JOBS"
}

sanitizer_tests() {
  cmake_build build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZEROWAIT_SANITIZE=ON
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS"
}

fuzz_tests() {
  CC=clang CXX=clang++ cmake_build build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DZEROWAIT_FUZZ=ON -DZEROWAIT_BUILD_TESTS=OFF
  local fuzzers=() fuzzer name corpus seeds log
  mapfile -t fuzzers < <(find build-fuzz -type f -perm -u+x -name 'fuzz_*' | sort)
  ((${#fuzzers[@]} > 0)) || {
    echo "no fuzz_* binaries were built in build-fuzz/" >&2
    return 1
  }
  # Real shards and tars as seeds, written by this build's CLI (tests/fuzz/make_seeds.sh).
  rm -rf build-fuzz/seeds
  tests/fuzz/make_seeds.sh build-fuzz/zerowait build-fuzz/seeds
  for fuzzer in "${fuzzers[@]}"; do
    name="$(basename "$fuzzer")"
    corpus="build-fuzz/corpus/$name"
    seeds="build-fuzz/seeds/$name"
    log="build-fuzz/$name.log"
    mkdir -p "$corpus" "$seeds"
    echo "$name: ${FUZZ_SECONDS} s (log: $log)"
    # New inputs go into the first corpus directory; the seeds are read too. -max_len leaves room
    # for a seed shard or tar (a few KB) to grow: libFuzzer's default would be the largest seed.
    if ! "$fuzzer" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -artifact_prefix="build-fuzz/$name-" "$corpus" "$seeds" >"$log" 2>&1; then
      tail -n 60 "$log" >&2
      echo "$name found a crash; the input is saved as build-fuzz/$name-*" >&2
      return 1
    fi
    # fuzz_shard also says how many inputs got past the checksums into ShardIndex::parse.
    grep -E '^Done [0-9]+ runs|^fuzz_shard: ' "$log" || tail -n 1 "$log"
  done
}

python_tests() {
  # One build serves both: the wheel users install (incremental in build/cp*/, the directory
  # setup.sh's `pip install .` uses) goes into .venv for the tests, and test_wheel.py installs it
  # as a new user.
  bash scripts/build-wheel.sh --python "$VPY" --no-show
  local wheel
  wheel="$(ls -t dist/zerowait-*-manylinux_*.whl | head -n 1)"
  "$VPY" -m pip install --quiet --force-reinstall --no-deps "$wheel"
  ZEROWAIT_WHEEL="$ROOT/$wheel" "$VPY" -m pytest tests/python -q
}

# --- run ---------------------------------------------------------------------------------------
run_step "setup" ensure_setup
run_step "C++ tests (build/)" dev_tests
if ((QUICK == 0)); then
  run_step "C++ tests under ASan+UBSan (build-asan/)" sanitizer_tests
  if [[ -f tests/fuzz/CMakeLists.txt ]]; then
    run_step "fuzzers, ${FUZZ_SECONDS} s each (build-fuzz/)" fuzz_tests
  else
    RESULTS+=("fuzzers: skipped (no tests/fuzz/CMakeLists.txt)")
  fi
else
  RESULTS+=("ASan+UBSan and fuzzers: skipped (--quick)")
fi
run_step "Python tests (pytest)" python_tests

step "summary"
printf '  %s\n' "${RESULTS[@]}"
if ((FAILED > 0)); then
  echo "test.sh: FAILED: $FAILED step(s) failed, $((SECONDS - START)) s in all"
  exit 1
fi
echo "test.sh: all steps passed in $((SECONDS - START)) s"
