#!/usr/bin/env bash
# Writes seed inputs for the fuzzers, generated rather than checked in so they follow the format:
#   OUT/fuzz_shard/  real shards (plain and --align) and a manifest, written by `zerowait pack`
#   OUT/fuzz_tar/    real tars of the same files: ustar, GNU ('L' long names) and pax records
# Every input is a few KB, far below the fuzzers' -max_len.
#
#   tests/fuzz/make_seeds.sh ZEROWAIT_CLI OUT_DIR
set -euo pipefail

cli="$1"
out="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Samples of one to three fields, an empty field, a JSON field, and a member path over 100 bytes
# (which a tar stores as a ustar prefix, a GNU long name or a pax record).
src="$work/src"
long_dir="$src/b/$(printf 'd%.0s' {1..60})"
mkdir -p "$src/a" "$long_dir"
printf 'hello' >"$src/a/one.txt"
printf '0' >"$src/a/one.cls"
printf 'world!!' >"$src/a/two.txt"
printf '1' >"$src/a/two.cls"
printf '{"k": [1, 2]}' >"$src/a/two.json"
printf 'x' >"$src/b/three.txt"
: >"$src/b/three.bin"
printf 'long' >"$long_dir/$(printf 'n%.0s' {1..60}).txt"

mkdir -p "$out/fuzz_shard" "$out/fuzz_tar"
"$cli" pack "$src" -o "$work/plain" --no-sync >/dev/null
"$cli" pack "$src" -o "$work/aligned" --align --no-sync >/dev/null
cp "$work/plain/shard-000000.zws" "$out/fuzz_shard/plain.zws"
cp "$work/aligned/shard-000000.zws" "$out/fuzz_shard/aligned.zws"
cp "$work/plain/manifest.json" "$out/fuzz_shard/manifest.json"

# -b 1: 512-byte records, so the tars end right after their two zero blocks.
for format in ustar gnu pax; do
  tar -C "$src" --sort=name --format="$format" -b 1 -cf "$out/fuzz_tar/$format.tar" a b
done
