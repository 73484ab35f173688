#!/usr/bin/env bash
# Sets up a machine to build, test and use zerowait, then runs the quick-start demo.
#
#   bash scripts/setup.sh            # system packages, .venv, `pip install .`, demo on sample data
#   bash scripts/setup.sh --no-demo  # everything but the demo (used by scripts/test.sh)
#
# For Debian 12; installs missing system packages with apt-get when run as root (or via sudo).
# Safe to run again: what is already in place is checked, not redone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DEMO=1
for arg in "$@"; do
  case "$arg" in
    --no-demo) DEMO=0 ;;
    -h | --help)
      sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "setup.sh: unknown option '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

step() { printf '\n==> %s\n' "$*"; }
die() {
  echo "setup.sh: error: $*" >&2
  exit 1
}
START=$SECONDS

# --- system packages ---------------------------------------------------------------------------
# shellcheck source=scripts/build-packages.sh
source "$ROOT/scripts/build-packages.sh"  # BUILD_LIBRARY_PACKAGES: the C++ libraries
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config python3-venv python3-dev
  "${BUILD_LIBRARY_PACKAGES[@]}"
  fio clang libclang-rt-14-dev curl
  # A real S3 server for the tests: Ceph RADOS Gateway on loopback (tests/s3/rgw.sh).
  radosgw ceph-mon ceph-osd ceph-common
  # A stuck file system for the tests: FUSE through fusepy (tests/python/stuck_fs.py).
  libfuse2
  # Network namespaces joined by a veth pair for the MTU probe of `zerowait bench net`.
  iproute2
  # Headless rendering of `zerowait report` pages in the tests (and the docs' screenshot).
  chromium
)
step "system packages"
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
  echo "all ${#APT_PACKAGES[@]} packages are installed"
else
  echo "installing: ${missing[*]}"
  SUDO=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || die "not root and no sudo: install these first: ${missing[*]}"
    SUDO=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update
  "${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi

# --- Python virtual environment ----------------------------------------------------------------
# The venv is made with the machine's python3 (a pyenv one or Debian's /usr/bin/python3).
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
step "Python environment in .venv"
command -v "$PYTHON" >/dev/null || die "'$PYTHON' not found; install python3 (>= 3.10)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  die "zerowait needs Python >= 3.10; '$PYTHON' is $("$PYTHON" --version 2>&1)"
if [[ -x "$VPY" ]] && ! "$VPY" -c 'import sys' 2>/dev/null; then
  echo "the existing .venv does not run (its base Python moved?); recreating it"
  rm -rf "$VENV"
fi
if [[ ! -x "$VPY" ]]; then
  "$PYTHON" -m venv "$VENV" ||
    die "'$PYTHON -m venv' failed; on Debian: apt-get install python3-venv"
  echo "created .venv with $("$VPY" --version)"
else
  echo "using .venv ($("$VPY" --version))"
fi

# pip, minus the warnings this machine's pip configuration prints for every package that one of
# its configured local indexes does not hold (harmless: the package comes from another index).
pip_install() {
  "$VPY" -m pip install "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

# Build and test requirements. Debian 12's cmake (3.25) and ninja serve the build; the pip
# versions are not required. The stamp skips pip entirely when nothing changed.
PY_REQUIREMENTS=("scikit-build-core>=0.10" "pybind11>=2.12" numpy pytest pytest-xdist safetensors
  fusepy pillow datasets prometheus_client)
TORCH_REQUIREMENT="torch==2.13.0"  # a CPU build; later features and the benchmarks use it
TORCHVISION_REQUIREMENT="torchvision==0.28.0"  # the release built against torch 2.13
STAMP="$VENV/.zerowait-requirements"
wanted="${PY_REQUIREMENTS[*]} $TORCH_REQUIREMENT $TORCHVISION_REQUIREMENT"
if [[ "$(cat "$STAMP" 2>/dev/null || true)" != "$wanted" ]]; then
  echo "installing ${PY_REQUIREMENTS[*]}"
  pip_install --quiet "${PY_REQUIREMENTS[@]}" ||
    die "pip install of the build requirements failed"
  echo "installing $TORCH_REQUIREMENT (large; takes a minute)"
  # torchvision for the benchmarks' augmentation pipelines; --no-deps keeps pip from replacing
  # the CPU torch with the CUDA build its wheel names.
  if pip_install --quiet "$TORCH_REQUIREMENT" &&
    pip_install --quiet --no-deps "$TORCHVISION_REQUIREMENT"; then
    printf '%s' "$wanted" >"$STAMP"
  else
    echo "setup.sh: warning: '$TORCH_REQUIREMENT' or '$TORCHVISION_REQUIREMENT' could not be" \
      "installed; zerowait itself works" \
      "without it, but the PyTorch integration and benchmarks will not. Continuing." >&2
  fi
else
  echo "Python requirements already installed"
fi

# --- the package and the `zerowait` command ----------------------------------------------------
step "building and installing zerowait into .venv (pip install .)"
# --no-build-isolation: build with the venv's scikit-build-core and pybind11 instead of fetching
# them again; the fixed build directory (pyproject.toml) makes a re-install incremental.
if [[ ! -d "$ROOT/build" ]] || ! ls "$ROOT"/build/cp*/CMakeCache.txt >/dev/null 2>&1; then
  echo "first build of the C++ core: a few minutes on 2 cores"
fi
pip_install --quiet --no-build-isolation "$ROOT" ||
  die "pip install . failed; rerun with: $VPY -m pip install -v --no-build-isolation ."
"$VPY" -c 'import zerowait; print("zerowait", zerowait.__version__, "installed")'
ZW="$VENV/bin/zerowait"
[[ -x "$ZW" ]] || die "the zerowait command is missing from .venv/bin after pip install"
# scripts/test.sh reruns this script when the script changed since the venv was set up.
sha256sum "$ROOT/scripts/setup.sh" | cut -d' ' -f1 >"$VENV/.zerowait-setup"

if ((DEMO == 0)); then
  step "setup done in $((SECONDS - START)) s (demo skipped)"
  exit 0
fi

# --- demo: small files -> shards -> verify -> inspect -> bench -> train-----------------------------
DATA="$ROOT/sample-data"
DEMO_FILES=2000
step "demo: $DEMO_FILES synthetic JPEGs in sample-data/images"
# Generation is deterministic, so an existing complete tree is reused.
if [[ "$(cat "$DATA/.images-complete" 2>/dev/null || true)" == "$DEMO_FILES" ]]; then
  echo "reusing sample-data/images"
else
  mkdir -p "$DATA"
  "$ZW" generate imagefolder "$DATA/images" --files "$DEMO_FILES"
  echo "$DEMO_FILES" >"$DATA/.images-complete"
fi

step "demo: zerowait pack sample-data/images -o sample-data/shards --imagefolder --overwrite"
"$ZW" pack "$DATA/images" -o "$DATA/shards" --imagefolder --overwrite
step "demo: zerowait verify sample-data/shards"
"$ZW" verify "$DATA/shards"
step "demo: zerowait inspect sample-data/shards"
"$ZW" inspect "$DATA/shards"

if [[ -x "$ROOT/bench/run" ]]; then
  step "demo: bench/run --files $DEMO_FILES --out sample-data/bench"
  # Without a dev build (build/), the benchmark's reader comes from the pip build's directory.
  if [[ -z "${ZEROWAIT_BENCH_READ:-}" && ! -x "$ROOT/build/zw_bench_read" ]]; then
    for candidate in "$ROOT"/build/cp*/zw_bench_read; do
      [[ -x "$candidate" ]] && export ZEROWAIT_BENCH_READ="$candidate"
    done
  fi
  PATH="$VENV/bin:$PATH" "$ROOT/bench/run" --files "$DEMO_FILES" --out "$DATA/bench"
else
  echo "(bench/run is not there yet; skipping the benchmark)"
fi

step "demo: a training loop fed by zerowait.Loader (examples/train.py, 40 steps)"
rm -rf "$DATA/train-checkpoints"  # a fresh run each time: train.py never writes over old steps
OMP_NUM_THREADS=1 "$VENV/bin/python" "$ROOT/examples/train.py" --data "$DATA/shards" \
  --steps 40 --batch-size 32 --image-size 64 --checkpoint "$DATA/train-checkpoints"

step "setup done in $((SECONDS - START)) s; try: .venv/bin/zerowait --help"
