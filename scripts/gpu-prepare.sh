#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a bare GPU machine that reaches no package registry:
# the Debian 12 packages of the C++ libraries zerowait builds against (headers, .pc files and
# shared libraries, with everything they load), and Python 3.12's headers in case that
# machine's Python has none. Everything lands in .gpu/ (ignored by git), which the device call
# carries beside the working tree.
#
#   bash scripts/gpu-prepare.sh          # download what is missing into .gpu/
#   bash scripts/gpu-prepare.sh --check  # say what is there, download nothing (exit 1: incomplete)
#
# Needs apt-get's package lists (Debian 12); run as root or any user who can run apt-get download.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/build-packages.sh
source scripts/build-packages.sh

CHECK=0
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    -h | --help)
      sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "gpu-prepare.sh: unknown option '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

DEBS="$ROOT/.gpu/debs"
PYINC="$ROOT/.gpu/python3.12-include"
mkdir -p "$DEBS"

# The packages to carry: the libraries' -dev packages, pkg-config (pkgconf) and every package
# they depend on, less those any machine that compiles C++ has (libc, libstdc++, the kernel
# headers): a second libc would break the machine's own programs.
SYSTEM_PACKAGES=(gcc-12-base libc-dev-bin libc6 libc6-dev libcrypt-dev libcrypt1 libgcc-s1
  libstdc++6 linux-libc-dev libnsl-dev libnsl2 libtirpc-common libtirpc-dev libtirpc3
  rpcsvc-proto)
closure() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances "${BUILD_LIBRARY_PACKAGES[@]}" pkgconf 2>/dev/null |
    grep -v '^[ <]' | sort -u | grep -vxF -f <(printf '%s\n' "${SYSTEM_PACKAGES[@]}")
}
mapfile -t wanted < <(closure)
((${#wanted[@]} > 0)) || {
  echo "gpu-prepare.sh: apt-cache knows none of: ${BUILD_LIBRARY_PACKAGES[*]} (run apt-get update)" >&2
  exit 1
}

missing=()
for pkg in "${wanted[@]}"; do
  compgen -G "$DEBS/${pkg}_*.deb" >/dev/null || missing+=("$pkg")
done
if ((${#missing[@]} > 0)); then
  if ((CHECK)); then
    echo "missing from .gpu/debs: ${missing[*]}" >&2
    exit 1
  fi
  echo "downloading ${#missing[@]} of ${#wanted[@]} packages into .gpu/debs"
  (cd "$DEBS" && apt-get download "${missing[@]}" >/dev/null 2> >(grep -v "Download is performed unsandboxed" >&2))
fi
# A package that left the closure (an older version, a dropped dependency) must not travel.
for deb in "$DEBS"/*.deb; do
  pkg="$(basename "$deb")"
  pkg="${pkg%%_*}"
  printf '%s\n' "${wanted[@]}" | grep -qxF "$pkg" || rm -f "$deb"
done
printf '%s\n' "${wanted[@]}" >"$DEBS/PACKAGES"

# Python 3.12's headers (one ABI for every 3.12.x): the device's interpreter is 3.12, and an
# interpreter installed without its headers cannot build the extension module.
if [[ ! -f "$PYINC/Python.h" ]]; then
  source_include=""
  for candidate in /root/.pyenv/versions/3.12*/include/python3.12 /usr/include/python3.12; do
    [[ -f "$candidate/Python.h" ]] && source_include="$candidate" && break
  done
  if [[ -n "$source_include" ]]; then
    ((CHECK)) && { echo "missing: .gpu/python3.12-include" >&2; exit 1; }
    mkdir -p "$PYINC"
    cp -r "$source_include"/. "$PYINC"/
  else
    echo "gpu-prepare.sh: note: no Python 3.12 headers on this machine; the device's own must do"
  fi
fi

echo ".gpu/ holds ${#wanted[@]} packages ($(du -sh "$DEBS" | cut -f1)) and" \
  "$([[ -f "$PYINC/Python.h" ]] && echo "Python 3.12's headers" || echo "no Python headers")"
